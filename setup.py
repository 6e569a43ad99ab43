"""The one compiled part of eggfuse: the runtime's dispatch-recording loop (runtime/_record.c).

Everything else is configured in pyproject.toml. The extension is optional: without a C
compiler the package installs without it and Session records through wgpu-py's cffi calls.
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildExt(build_ext):
    """Builds the extension at -O3 with GCC-style compilers: GCC vectorises the input checks'
    loops only from -O3 on, and Python may have been built at -O2."""

    def build_extensions(self) -> None:
        if self.compiler.compiler_type == "unix":
            for ext in self.extensions:
                ext.extra_compile_args = [*ext.extra_compile_args, "-O3"]
        super().build_extensions()


setup(ext_modules=[Extension("eggfuse.runtime._record", ["runtime/_record.c"], optional=True)],
      cmdclass={"build_ext": BuildExt})
