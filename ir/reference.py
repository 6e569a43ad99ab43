"""Numpy reference interpreter: the oracle every test compares against."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from .errors import InputError
from .graph import Graph, NodeId, require_graph
from .spec import OPS
from .types import DType, TensorType


def check_array(what: str, value, ty: TensorType, *, copy: bool = True, finite: bool = True,
                exact: bool = False) -> np.ndarray:
    """Return ``value`` as an array of ``ty``; raise :class:`InputError` if it does not fit.

    The result is a fresh array (a copy or a new conversion), or with ``copy=False``
    ``value`` itself when it is already an array of ``ty``'s dtype (for a caller that only
    reads it). Floats must be finite unless ``finite=False``. With ``exact=True`` integers
    given for an F32 tensor must convert to float32 exactly (every one up to 2^24 in magnitude
    does, beyond that only some). The caller's array is never modified.
    """
    try:
        arr = np.asarray(value)
    except Exception as e:  # noqa: BLE001 - anything numpy cannot take is a user error
        raise InputError(f"{what}: cannot convert {type(value).__name__} to an array ({e})") from None
    if arr.dtype.kind in "US":  # text: numpy makes a string array of it, whose shape says nothing
        got = (f"an array of {arr.dtype} {list(arr.shape)}" if isinstance(value, np.ndarray)
               else f"{type(value).__name__} {value!r:.40}")
        raise InputError(f"{what}: expected numbers, got text ({got}); pass an array of shape {list(ty.shape)} and "
                         f"dtype {ty.dtype.numpy.name} ({ty})")
    if arr.shape != ty.shape or arr.dtype.kind == "O":
        if arr.ndim == 0 and arr.dtype.kind == "O":  # None, or one object numpy holds as no number: not "got []"
            got = "None, not an array" if value is None else (f"{type(value).__name__} {value!r:.40}, which numpy "
                                                              "holds as an object, not a number")
            raise InputError(f"{what}: got {got}; pass an array of shape {list(ty.shape)} and dtype "
                             f"{ty.dtype.numpy.name} ({ty})")
        if arr.shape != ty.shape:
            raise InputError(f"{what}: expected shape {list(ty.shape)} ({ty}), got {list(arr.shape)}")
    if ty.dtype in (DType.U32, DType.I32):
        info = np.iinfo(ty.dtype.numpy)
        if not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_ and ty.dtype is DType.I32):
            # (bools for indices were read as rows 0 and 1: a mask given where indices belong, most likely)
            kind = "integer indices" if ty.dtype is DType.U32 else "integers"
            raise InputError(f"{what}: expected {kind} for {ty}, got dtype {arr.dtype}")
        if arr.size and not np.can_cast(arr.dtype, ty.dtype.numpy) and (
                arr.min() < info.min or arr.max() > info.max):
            what_ = "indices" if ty.dtype is DType.U32 else "values"
            span = "[0, 2^32)" if ty.dtype is DType.U32 else f"[-2^31, 2^31) for {ty}"
            narrowed = (" (eggfuse's integers are 32-bit, an ONNX model's int64 too: give values that fit 32 bits)"
                        if arr.dtype == np.int64 and ty.dtype is DType.I32 else "")
            raise InputError(f"{what}: {what_} must lie in {span}, got {arr.min()}..{arr.max()}{narrowed}")
        return arr.astype(ty.dtype.numpy, copy=copy)
    if ty.dtype is DType.BOOL:
        if arr.dtype != np.bool_:
            raise InputError(f"{what}: expected a bool array for {ty}, got dtype {arr.dtype}")
        return arr.astype(np.bool_, copy=copy)
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise InputError(f"{what}: expected numbers for {ty}, got dtype {arr.dtype}")
    if arr.dtype.kind == "f" and arr.dtype.itemsize > 4:  # a finite value beyond float32's range: inf, said below
        with np.errstate(over="ignore"):
            out = arr.astype(np.float32, copy=copy)
    else:  # (no errstate on the common path: it costs a microsecond a feed)
        out = arr.astype(np.float32, copy=copy)
    if exact and arr.dtype.kind in "iu" and arr.dtype.itemsize >= 4 and arr.size and np.abs(out).max() >= 2**24:
        inexact = inexact_f32(arr, out)
        if inexact.size:
            at = [int(i) for i in np.unravel_index(inexact[0], arr.shape)]
            raise InputError(f"{what}: {inexact.size} of {arr.size} integer values have no exact float32 for {ty}, the "
                             f"first {arr.flat[inexact[0]]} at {at} (float32 holds every integer up to 2^24 = 16777216 "
                             f"in magnitude, beyond that only some); pass float32 values (arr.astype(np.float32), if "
                             f"that rounding is intended)")
    if finite and not np.isfinite(out).all():
        if np.isfinite(arr).all():
            big = arr.flat[int(np.argmax(np.abs(arr)))]
            raise InputError(f"{what}: {float(big):g} is beyond float32's range (|x| < 3.4e38) for {ty}; "
                             f"scale the input")
        bad = ~np.isfinite(out)
        at = [int(i) for i in np.argwhere(bad)[0]]
        raise InputError(f"{what}: contains NaN or infinity ({int(bad.sum())} of {out.size} elements, the first "
                         f"{float(out[tuple(at)])} at {at}); eggfuse computes only with finite arrays: give finite "
                         "values")
    return out


def inexact_f32(arr: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The flat positions of the integers of ``arr`` (an integer array) that ``out``, ``arr`` as float32, does not
    hold exactly: float32 holds every integer up to 2^24 in magnitude, beyond that only some, and the rounding may
    reach 2^bits, past the integer type's end."""
    flat = arr.reshape(-1)
    big = np.flatnonzero(np.abs(flat.astype(np.float64)) > 2**24)  # every integer up to 2^24 is exact
    given, rounded = flat[big], out.reshape(-1)[big].astype(np.float64)  # float32's integers, exact in float64
    fits = rounded < float(np.iinfo(arr.dtype).max) + 1  # the rounding may reach 2^bits, past the integer type
    return big[~fits | (np.where(fits, rounded, 0).astype(arr.dtype) != given)]


def as_reference(value, ty: TensorType) -> np.ndarray:
    """``value`` in the reference's representation of ``ty``: float64 for F32, int64 for
    I32 (exact; the device's int32 wraps where this does not), uint32 for U32, bool for BOOL."""
    arr = np.asarray(value)
    if ty.dtype is DType.F32:
        return arr.astype(np.float64, copy=False)
    if ty.dtype is DType.I32:
        return arr.astype(np.int64, copy=False)
    if ty.dtype is DType.U32:
        return arr.astype(np.uint32, copy=False)
    return arr.astype(np.bool_, copy=False)


def check_mapping(kind: str, value, names: Iterable[str]) -> None:
    """Raise :class:`InputError` unless ``value`` (the ``kind`` leaves given: 'input',
    'parameter') is a mapping of name -> array; the message lists the graph's ``names``."""
    if not isinstance(value, Mapping):
        known = ", ".join(repr(n) for n in names) or "none"
        raise InputError(f"{kind}s must be a mapping of name -> array (a dict), got {type(value).__name__}; "
                         f"the graph's {kind}s are: {known}")


def evaluate(
    graph: Graph,
    inputs: Mapping[str, np.ndarray],
    params: Mapping[str, np.ndarray] | None = None,
    outputs: Sequence[NodeId] | None = None,
    *,
    check_finite: bool = True,
) -> list[np.ndarray]:
    """Evaluate ``graph`` in float64 numpy; returns one array per output node. ``params`` None: the graph has no
    parameters.

    ``inputs`` and ``params`` map leaf names to arrays of the leaf's shape (any float
    dtype; integer indices for U32 inputs). Each leaf's value is first rounded to its type, float32 for an
    f32 leaf, as the device holds it; the ops then run in float64 (a finite difference of a step below
    float32's resolution, such as 1e-5 on a value near 1, measures that rounding: take 2**-10).
    Raises :class:`InputError` for a ``graph`` that is not a Graph, a missing or
    mis-shaped leaf, feeds that are not mappings and (unless ``check_finite=False``) a NaN or
    infinity in a float leaf, :class:`~eggfuse.ir.GraphError` when ``outputs`` is not given
    and the graph has none. The arrays passed in are not modified.
    """
    require_graph("evaluate", graph)
    params = {} if params is None else params
    if outputs is None:
        graph.check_outputs()
    check_mapping("input", inputs, graph.inputs)
    check_mapping("parameter", params, graph.parameters)
    wanted = list(graph.outputs if outputs is None else outputs)
    values: dict[NodeId, np.ndarray] = {}
    for node in graph.live_nodes() if outputs is None else graph.nodes:
        if node.op in ("Input", "Parameter"):
            src = inputs if node.op == "Input" else params
            name = node.attrs["name"]
            if name not in src:
                raise InputError(f"{node.op} {name!r} ({node.type}) was not given")
            arr = check_array(f"{node.op} {name!r}", src[name], node.type, finite=check_finite)
            values[node.id] = as_reference(arr, node.type)
        elif node.op == "Constant":
            values[node.id] = as_reference(node.attrs["value"], node.type)
        else:
            args = [values[i] for i in node.inputs]
            out = np.asarray(OPS[node.op].reference(args, node.attrs)).reshape(node.type.shape)
            values[node.id] = as_reference(out, node.type)
    return [values[o] for o in wanted]
