"""Project exception types.

Every error a user can provoke is raised as a subclass of :class:`EggfuseError`, with a
message that names the node, the op and the shapes involved.
"""


class EggfuseError(Exception):
    """Base class of every error eggfuse raises on purpose."""


class GraphError(EggfuseError, ValueError):
    """A graph is malformed: a builder got inputs whose shapes or dtypes the op rejects."""


class InputError(EggfuseError, ValueError):
    """Data given at run time (feeds, parameters, sentences) does not match the graph."""


class IndexRangeError(InputError):
    """An input of indices holds one outside the axis an op indexes with it. ``input``: the input's
    name; ``index``: the value the message names (the input's largest where that one is out of
    range, else its smallest); ``rows``: the axis's length."""

    def __init__(self, message: str, *, input: str, index: int, rows: int) -> None:  # noqa: A002 - the field's name
        super().__init__(message)
        self.input, self.index, self.rows = input, int(index), int(rows)

    def __reduce__(self):
        return _index_range_error, (type(self), str(self), self.input, self.index, self.rows), self.__dict__


def _index_range_error(cls: type, message: str, input: str, index: int, rows: int) -> IndexRangeError:  # noqa: A002
    return cls(message, input=input, index=index, rows=rows)


class RewriteError(EggfuseError):
    """The rewrite engine failed: extraction, rebuild or verification went wrong."""


class LoweringError(EggfuseError):
    """A graph cannot be lowered to the device (a limit is exceeded, an op has no kernel).

    ``nodes``: the ids of the nodes of the lowered graph the error is about (empty when it is about
    none, e.g. a plan lowered for another device). ``sources``: the ids of the nodes of the graph given to
    ``eggfuse.compile`` that those compute (the same ids when it was not optimised; through the
    rewrite report's :attr:`~eggfuse.rewrites.Report.origins` when it was), which an ONNX
    :class:`~eggfuse.onnx.Model` names by their ONNX node names in the message.
    """

    def __init__(self, message: str = "", *, nodes: tuple[int, ...] | list[int] = (),
                 sources: tuple[int, ...] | list[int] | None = None) -> None:
        super().__init__(message)
        self.nodes = tuple(int(n) for n in nodes)
        self.sources = self.nodes if sources is None else tuple(int(n) for n in sources)


class DeviceLimitError(LoweringError):
    """A plan exceeds one of the device's limits (a buffer, a binding, the bindings of a dispatch, a
    uniform or the workgroup grid)."""


class DeviceError(EggfuseError):
    """No usable wgpu adapter or device, or the device rejected a command."""


class ModelError(EggfuseError):
    """A model's weights or tokenizer could not be found or loaded."""


class OnnxError(ModelError):
    """An ONNX model cannot be imported: an op type, dtype, attribute, opset or shape that
    eggfuse does not support, named with the node and tensor concerned."""


class DamagedFileError(OnnxError):
    """An ONNX file's stored data does not match what it declares (a truncated or hand-edited
    file): no input or option can help; export it again."""


class UnsupportedOpsError(OnnxError):
    """A model uses op types eggfuse cannot run. ``ops`` maps each such op type to
    ``(count, first node name)``; the message lists them all."""

    def __init__(self, message: str, ops: dict[str, tuple[int, str]]) -> None:
        super().__init__(message)
        self.ops = ops
