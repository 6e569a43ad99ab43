"""Scan and Loop, unrolled at load time.

eggfuse plans have static shapes and no control flow, so the importer runs a Scan or Loop
body once per iteration, as it inlines an If's branch: each iteration's nodes go through the
ordinary converters (or fold at load time when their inputs are known). The iteration count
must be known at load time: a Scan's from its scan inputs' shapes, a Loop's from its trip
count ``M`` and the condition its body computes (both known values, or computed from graph
inputs that :class:`~eggfuse.onnx.Model` then binds per value, :class:`NeedsValuesError`).

Scan (opset 9 and later; https://onnx.ai/onnx/operators/onnx__Scan.html): the body takes the
N state values and one slice of each of the M scan inputs (along ``scan_input_axes``, in
``scan_input_directions``) and returns the N new states and one slice of each scan output,
which are stacked along ``scan_output_axes`` (reversed where ``scan_output_directions`` is 1).
Loop (https://onnx.ai/onnx/operators/onnx__Loop.html): the body takes the iteration number,
the condition and the N carried values and returns the condition, the N carried values and
the scan outputs' slices, stacked along a new first axis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper

from eggfuse.ir import OnnxError

if TYPE_CHECKING:
    from .importer import Importer, Value

#: The most iterations a Loop without a known trip count is unrolled to.
MAX_ITERATIONS = 4096


class _Emitter:
    """Builds the slicing and stacking nodes of one unrolled Scan or Loop through the importer."""

    def __init__(self, importer: Importer, node: onnx.NodeProto, version: int) -> None:
        importer._count += 1
        self.importer, self.version = importer, version
        self.prefix = f"{node.name or node.op_type}/{importer._count}/"
        self.names: dict[str, Value] = {}
        self.k = 0

    def fresh(self) -> str:
        self.k += 1
        return f"{self.prefix}{self.k}"

    def known(self, array: np.ndarray) -> str:
        from .importer import Value

        name = self.fresh()
        arr = np.asarray(array)
        self.names[name] = Value(name, helper.np_dtype_to_tensor_dtype(arr.dtype), tuple(arr.shape), const=arr)
        return name

    def emit(self, op_type: str, inputs: list[Value | str], **attrs) -> Value:
        names = []
        for v in inputs:
            if isinstance(v, str):
                names.append(v)
            else:
                names.append(self.fresh())
                self.names[names[-1]] = v
        out = self.fresh()
        self.importer._node(helper.make_node(op_type, names, [out], name=out, **attrs), self.names, self.version)
        return self.names[out]

    def take(self, x: Value, index: int, axis: int) -> Value:
        """``x``'s slice ``index`` along ``axis`` (the axis removed)."""
        return self.emit("Gather", [x, self.known(np.array(index, dtype=np.int64))], axis=axis)

    def stack(self, parts: list[Value], axis: int) -> Value:
        """``parts`` stacked along a new ``axis``."""
        if self.version >= 13:
            axes = self.known(np.array([axis], dtype=np.int64))
            ups = [self.emit("Unsqueeze", [p, axes]) for p in parts]
        else:
            ups = [self.emit("Unsqueeze", [p], axes=[axis]) for p in parts]
        return ups[0] if len(ups) == 1 else self.emit("Concat", ups, axis=axis)


def _body(importer: Importer, node: onnx.NodeProto, graph: onnx.GraphProto, args: list[Value],
          env: dict[str, Value], version: int) -> list[Value]:
    """The values ``graph``'s outputs take with its inputs bound to ``args``."""
    if len(graph.input) != len(args):
        raise OnnxError(f"{node.op_type} node {node.name!r}: its body takes {len(graph.input)} inputs, the node gives "
                        f"{len(args)}")
    inner = dict(env)
    importer.local_initializers(graph, inner)
    for vi, v in zip(graph.input, args, strict=True):
        inner[vi.name] = v
    importer._nodes(graph.node, inner, version)
    out = []
    for vi in graph.output:
        if vi.name not in inner:
            raise OnnxError(f"{node.op_type} node {node.name!r}: body output {vi.name!r} is computed by no node")
        out.append(inner[vi.name])
    for k, v in inner.items():  # the body's values stay visible to blocked-op bookkeeping only
        if k not in env and v.blocked:
            env[k] = v
    return out


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def scan(importer: Importer, node: onnx.NodeProto, ins: list[Value | None], env: dict[str, Value],
         version: int) -> list[Value]:
    """The outputs of Scan ``node`` (opset 9+), its body unrolled over the scan axis."""
    where = f"Scan node {node.name!r}"
    if version < 9:
        raise OnnxError(f"{where}: opset {version}'s Scan (with a batch axis and sequence_lens) is not supported; "
                        "upgrade the model to opset 9 or later (onnx.version_converter)")
    body = _attr(node, "body")
    m = int(_attr(node, "num_scan_inputs", 0))
    if any(v is None for v in ins) or not 1 <= m <= len(ins):
        raise OnnxError(f"{where}: needs its {m} scan inputs after the states, every input given")
    n = len(ins) - m
    states, xs = list(ins[:n]), list(ins[n:])
    in_axes = [a % len(x.shape) if x.shape else a for a, x in zip(_attr(node, "scan_input_axes", [0] * m), xs,
                                                                    strict=True)]
    in_dirs = list(_attr(node, "scan_input_directions", [0] * m))
    lengths = {x.shape[a] for x, a in zip(xs, in_axes, strict=True)}
    if any(not x.shape for x in xs) or len(lengths) != 1:
        raise OnnxError(f"{where}: its scan inputs have shapes {[list(x.shape) for x in xs]} along axes {in_axes}; "
                        "they must share the scan axis' length")
    (steps,) = lengths
    if steps < 1:
        raise OnnxError(f"{where}: the scan axis has length 0; eggfuse cannot make its empty outputs")
    e = _Emitter(importer, node, version)
    slices: list[list[Value]] = []
    for t in range(steps):
        elems = [e.take(x, steps - 1 - t if d else t, a) for x, a, d in zip(xs, in_axes, in_dirs, strict=True)]
        outs = _body(importer, node, body, states + elems, env, version)
        states, ys = outs[:n], outs[n:]
        slices.append(ys)
    k = len(slices[0])
    out_axes = list(_attr(node, "scan_output_axes", [0] * k))
    out_dirs = list(_attr(node, "scan_output_directions", [0] * k))
    stacked = []
    for j in range(k):
        parts = [s[j] for s in slices]
        if out_dirs[j]:
            parts.reverse()
        stacked.append(e.stack(parts, out_axes[j] % (len(parts[0].shape) + 1)))
    return states + stacked


def loop(importer: Importer, node: onnx.NodeProto, ins: list[Value | None], env: dict[str, Value],
         version: int) -> list[Value]:
    """The outputs of Loop ``node``, its body unrolled for its known trip count and condition."""
    from .importer import NeedsValuesError, Value

    where = f"Loop node {node.name!r}"

    def known(v: Value | None, what: str):
        if v is None:
            return None
        if v.const is None:
            raise NeedsValuesError(f"{where}: its {what} depends on the graph's inputs "
                                   f"{', '.join(map(repr, sorted(v.deps))) or '(none)'}: eggfuse unrolls a Loop only "
                                   "when its trip count and condition are known at load time", v.deps)
        return np.asarray(v.const).reshape(-1)[0]

    trip = known(ins[0] if ins else None, "trip count M")
    cond = known(ins[1] if len(ins) > 1 else None, "condition")
    if trip is None and cond is None:
        raise OnnxError(f"{where}: neither a trip count nor a condition is given: it would run forever")
    body = _attr(node, "body")
    carried = list(ins[2:])
    if any(v is None for v in carried):
        raise OnnxError(f"{where}: every loop-carried input must be given")
    e = _Emitter(importer, node, version)
    limit = int(trip) if trip is not None else MAX_ITERATIONS
    slices: list[list[Value]] = []
    i = 0
    while i < limit and (cond is None or bool(cond)):
        it = Value("", onnx.TensorProto.INT64, (), const=np.array(i, dtype=np.int64))
        cond_in = Value("", onnx.TensorProto.BOOL, (), const=np.array(True if cond is None else bool(cond)))
        outs = _body(importer, node, body, [it, cond_in, *carried], env, version)
        if cond is not None:  # without a condition input the body's condition is ignored (a for loop)
            cond = known(outs[0], f"condition after iteration {i}")
        carried, ys = outs[1:1 + len(carried)], outs[1 + len(carried):]
        slices.append(ys)
        i += 1
    if trip is None and i == MAX_ITERATIONS and bool(cond):
        raise OnnxError(f"{where}: its condition is still true after {MAX_ITERATIONS} iterations; eggfuse unrolls "
                        "loops of at most that many")
    k = len(body.output) - 1 - len(carried)
    if k and not slices:
        raise OnnxError(f"{where}: it runs no iteration, so its {k} scan output(s) would be empty, which eggfuse "
                        "cannot store")
    return carried + [e.stack([s[j] for s in slices], 0) for j in range(k)]
