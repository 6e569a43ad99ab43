"""The one compiled part of eggfuse: the runtime's dispatch-recording loop (runtime/_record.c).

Everything else is configured in pyproject.toml. The extension is optional: without a C
compiler the package installs without it and Session records through wgpu-py's cffi calls.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("eggfuse.runtime._record", ["runtime/_record.c"], optional=True)])
