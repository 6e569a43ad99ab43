"""eggfuse: a compiler for neural-network op graphs.

Graphs (``eggfuse.ir``) are encoded into egglog, fused by declarative rulesets
(``eggfuse.rewrites``), extracted by cost, lowered to WGSL dispatches
(``eggfuse.lowering``) and run through wgpu (``eggfuse.runtime``)::

    import eggfuse
    result = eggfuse.embed(["A man is eating food.", "A man is eating pasta."])
    result.embeddings          # float32 [2, 384]
    result.similarity()        # cosine similarity [2, 2]

    model = eggfuse.load_model("path/to/model")   # a Hugging Face folder or a .gguf file
    eggfuse.generate("Hello", model=model)        # or eggfuse.embed([...], model=...) for an encoder
"""

from eggfuse.api import Compiled, EmbedResult, compile, embed
from eggfuse.generate import GenerateResult, Generator, generate
from eggfuse.ir import (
    DeviceError,
    DType,
    EggfuseError,
    Graph,
    GraphError,
    InputError,
    LoweringError,
    ModelError,
    RewriteError,
    TensorType,
    evaluate,
)
from eggfuse.ir.optim import SGD, Adam
from eggfuse.models.hf import load_model

_REWRITES = ("CostModel", "KernelInfo", "Report", "optimize")


def __getattr__(name: str):
    # The rewrite engine (egglog) loads on first use: running a compiled graph needs only
    # the IR, lowering and runtime.
    if name in _REWRITES:
        from eggfuse import rewrites

        return getattr(rewrites, name)
    if name == "Trainer":  # nor wgpu: the runtime loads on first use too
        from eggfuse.trainer import Trainer

        return Trainer
    if name == "onnx":  # eggfuse.onnx.load(...) after a bare `import eggfuse`; the onnx package loads then
        import importlib

        return importlib.import_module("eggfuse.onnx")
    raise AttributeError(f"module 'eggfuse' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the names loaded on first use (above) and the onnx subpackage too, for dir() and tab completion
    return sorted({*globals(), *__all__, "onnx"})

__all__ = [
    "SGD", "Adam", "Compiled", "CostModel", "DType", "DeviceError", "EggfuseError", "EmbedResult", "GenerateResult",
    "Generator", "Graph", "GraphError", "InputError", "KernelInfo", "LoweringError", "ModelError", "Report",
    "RewriteError", "TensorType", "Trainer", "compile", "embed", "evaluate", "generate", "load_model", "optimize",
]
