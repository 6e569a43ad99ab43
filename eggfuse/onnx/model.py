"""An ONNX model compiled per set of input shapes: :class:`Model`."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from eggfuse.ir import Graph, IndexRangeError, InputError, LoweringError
from eggfuse.ir.reference import inexact_f32

from .importer import (
    COMPUTED_IN_F32,
    ELEM_DTYPE,
    NeedsValuesError,
    Value,
    _dims,
    _load_proto,
    as_f32,
    checked_shapes,
    declared_mismatch,
    declared_shape,
    elem_name,
    elem_numpy,
    graph_inputs,
    import_model,
    onnx_index_readers,
    overridable_inputs,
    raise_non_tensor,
    takes_kind,
    unknown_input,
    with_onnx_nodes,
)


@dataclass
class Specialised:
    """One import and compilation of a :class:`Model`: for ``shapes`` (and ``values``, the
    inputs bound at load time). ``outputs`` are the ONNX output Values (element types);
    ``compiled`` the :class:`eggfuse.Compiled` (None until compiled); ``timings`` seconds."""

    shapes: dict[str, tuple[int, ...]]
    values: dict[str, np.ndarray]
    graph: Graph
    params: dict[str, np.ndarray]
    outputs: list[Value]
    compiled: Any = None
    timings: dict[str, float] = field(default_factory=dict)


def _feed_f32(arr: np.ndarray, name: str, elem: int) -> np.ndarray:
    """The feed ``arr`` (integers or floats) of the input ``name`` of ONNX element type ``elem`` (FLOAT, or one of
    COMPUTED_IN_F32), as float32: InputError where an integer does not convert exactly (float32 holds every integer up
    to 2^24 in magnitude, beyond that only some) or a finite float lies beyond float32's range. A float64 value is
    rounded to the nearest float32, as a float32 model computes it anyway."""
    if arr.dtype.kind in "iu":
        out = arr.astype(np.float32)
        inexact = inexact_f32(arr, out)
        if inexact.size:
            raise InputError(f"input {name!r} ({elem_name(elem)}, computed in float32): {inexact.size} integer "
                             f"value(s) such as {arr.flat[inexact[0]]} have no exact float32 (float32 holds every "
                             f"integer up to 2^24 = 16777216, beyond that only some); convert them yourself, "
                             f"arr.astype('float32'), if that rounding is intended")
        return out
    if elem in COMPUTED_IN_F32:  # a DOUBLE (FLOAT16, BFLOAT16) input eggfuse computes in float32
        return as_f32(arr, f"input {name!r}", InputError)
    with np.errstate(over="ignore"):
        out = arr.astype(np.float32)
    bad = np.isinf(out) & np.isfinite(arr)
    if bad.any():
        raise InputError(f"input {name!r} takes float32; {int(bad.sum())} value(s) of the {arr.dtype} feed, up to "
                         f"{float(np.max(np.abs(arr[bad]))):.3g}, lie beyond its range (+-3.4e+38): rescale them, or "
                         f"give infinities where infinities are meant")
    return out


class Model:
    """An ONNX model run by eggfuse on the GPU (or lavapipe).

    ``model``: a path or an ``onnx.ModelProto`` (not modified). ``shapes``: input name ->
    shape for dimensions the model leaves symbolic; dimensions not given are taken from each
    run's feeds, and a plan is imported, optimised (``fuse``), lowered and cached per set of
    input shapes. ``fuse``, ``cost_model``, ``verify``, ``device``, ``cache``, ``precision`` and
    ``rulesets`` (None: the default ones; ``eggfuse.rewrites.rulesets.select(optional=["layer_norm_prologue"])``
    adds an optional one) go to :func:`eggfuse.compile` (``precision="f16"``: the initializers the
    rewrite engine finds as the B of a ``MatMul`` [K, N] or ``MatMulBT`` [N, K] with K a multiple of
    32, and the tables a ``Gather`` reads with rows a multiple of 32 long, are stored as float16).

    :meth:`run` takes feeds by name (or a sequence in input order) and returns the outputs
    in the model's output order, in their ONNX dtypes (float32, int64, int32, bool). A feed is
    converted to the type eggfuse computes in: an integer input (int64 or int32, computed in
    int32) takes any integer array whose values fit int32, a float input any real array
    (to float32: a float64 value rounded to the nearest, an integer only where float32 holds it
    exactly, every one up to 2^24 in magnitude); onnxruntime, stricter, refuses a dtype other
    than the declared one. An input the import must know (a Reshape's shape fed as an input, an
    ``If``'s condition) is bound at load time to its fed value: the model is imported once per
    such value.
    Raises :class:`~eggfuse.ir.OnnxError` / :class:`~eggfuse.ir.UnsupportedOpsError` when the
    model cannot be imported, also at the shapes of a run's feeds;
    :class:`~eggfuse.ir.InputError` for feeds that do not fit: a missing or unknown
    input, a wrong dtype, a rank or fixed dimension other than the input declares, an integer or
    float64 value float32 cannot hold (a float input), and
    indices outside the axis a Gather reads them along (``IndexRangeError``);
    :class:`~eggfuse.ir.LoweringError` (:class:`~eggfuse.ir.DeviceLimitError`) when a plan exceeds
    the device's limits, its message ending with the ONNX nodes concerned (those whose ops a fused
    dispatch computes), e.g. ``[ONNX nodes '/fc/MatMul' (MatMul), '/fc/Add' (Add)]``.
    """

    def __init__(self, model: str | os.PathLike | onnx.ModelProto | bytes, *,
                 shapes: Mapping[str, Sequence[int]] | None = None,
                 fuse: bool = True, cost_model=None, verify: bool = False, device=None, cache: bool = True,
                 precision: str = "f32", rulesets=None) -> None:
        self.proto = _load_proto(model)
        self.inputs = graph_inputs(self.proto)
        self.input_names = [vi.name for vi in self.inputs]
        for vi in [*self.inputs, *self.proto.graph.output]:
            if not vi.type.HasField("tensor_type"):
                raise_non_tensor(self.proto, vi)
        self.output_names = [vi.name for vi in self.proto.graph.output]
        self.shapes = checked_shapes(shapes, self.proto)
        self.fuse, self.cost_model, self.verify, self.device, self.cache = fuse, cost_model, verify, device, cache
        self.rulesets = rulesets
        from eggfuse.pipeline import precision_rulesets

        precision_rulesets(precision)  # checked now, not at the first run
        if cost_model is not None:
            from eggfuse.rewrites.cost import CostModel

            if not isinstance(cost_model, CostModel):  # it failed at the first run, inside the rewrite engine
                raise InputError(f"cost_model must be a CostModel (eggfuse.rewrites), got {type(cost_model).__name__} "
                                 f"{cost_model!r:.60}; for a name as the command line takes it, "
                                 "eggfuse.rewrites.roofline.cost_model_from_spec('roofline') makes one")
        if precision == "f16" and (not fuse or verify):
            raise InputError("precision='f16' is chosen by the rewrite engine (the f16 ruleset rounds weights), so it "
                             f"needs fuse=True and verify=False; got fuse={fuse!r}, verify={verify!r}")
        self.precision = precision
        self.plans: dict[tuple, Specialised] = {}
        self._control: set[str] = set()  # inputs bound as load-time values (the import needs them)

    @property
    def static(self) -> bool:
        """Every input's shape is fixed (by the model or ``shapes``)."""
        return all(vi.name in self.shapes or all(isinstance(d, int) for d in _dims(vi)) for vi in self.inputs)

    def specialise(self, feeds: Mapping[str, np.ndarray] | None = None, _empty: frozenset = frozenset()) -> Specialised:
        """The import for the shapes of ``feeds`` (shapes fixed by the model or ``shapes``
        where a feed is not given), compiled and cached."""
        feeds = dict(feeds or {})
        shapes = dict(self.shapes)
        for vi in self.inputs:  # fixed by the model: one key with or without feeds (prepare, then run)
            dims = _dims(vi)
            if vi.name not in shapes and vi.type.tensor_type.HasField("shape") and all(isinstance(d, int)
                                                                                       for d in dims):
                shapes[vi.name] = tuple(dims)
        for name, arr in feeds.items():
            if name in self.shapes and tuple(np.shape(arr)) != self.shapes[name]:
                raise InputError(f"input {name!r}: fed an array of shape {list(np.shape(arr))}, but this Model was "
                                 f"made with shapes={{{name!r}: {list(self.shapes[name])}}}; feed that shape, or "
                                 "make the Model without it (each run's feeds then give the shapes)")
            shapes[name] = tuple(np.shape(arr))
        control = self._control | _empty
        values = {n: np.asarray(feeds[n]) for n in control if n in feeds}
        key = (tuple(sorted(shapes.items())), tuple(sorted((n, v.tobytes(), v.shape) for n, v in values.items())))
        if key in self.plans:
            return self.plans[key]
        t = time.perf_counter()
        try:
            graph, params, outs, origin = import_model(self.proto, shapes, values)
        except NeedsValuesError as e:
            if not e.inputs or not set(e.inputs) <= set(feeds) or set(e.inputs) <= control:
                raise
            if all(0 in np.shape(feeds[n]) for n in e.inputs):
                # empty feeds: load-time values of these shapes only, so later runs with contents stay on the GPU
                return self.specialise(feeds, _empty | set(e.inputs))
            self._control |= set(e.inputs)
            return self.specialise(feeds, _empty)
        spec = Specialised(shapes, values, graph, params, outs)
        spec.timings["import_s"] = time.perf_counter() - t
        from eggfuse.pipeline import compile as compile_graph

        if graph.outputs:
            # ONNX feeds may hold NaN and infinities (IsNaN, IsInf): the session takes them
            try:
                spec.compiled = compile_graph(graph, params, fuse=self.fuse, cost_model=self.cost_model,
                                              verify=self.verify, device=self.device, finite_inputs=False,
                                              finite_parameters=False,
                                              cache=self.cache, precision=self.precision, rulesets=self.rulesets)
            except LoweringError as e:  # named by the ONNX nodes it is about
                named = with_onnx_nodes(e, origin, self.proto.graph)
                if named is e:
                    raise
                raise named from None
            spec.timings.update(spec.compiled.timings)
        self.plans[key] = spec
        return spec

    def _feeds(self, feeds: Mapping[str, Any] | Sequence[Any]) -> dict[str, np.ndarray]:
        if isinstance(feeds, Mapping):
            given = dict(feeds)
        elif isinstance(feeds, Sequence) and not isinstance(feeds, str | bytes):
            if len(feeds) != len(self.input_names):
                raise InputError(f"got {len(feeds)} inputs, the model takes {len(self.input_names)}: "
                                 f"{', '.join(map(repr, self.input_names))}")
            given = dict(zip(self.input_names, feeds, strict=True))
        else:
            raise InputError(f"feeds must be a mapping of input name -> array or a sequence in input order, got "
                             f"{type(feeds).__name__}")
        for name in given:
            if name not in self.input_names:
                raise unknown_input(name, self.input_names, InputError, defaults=overridable_inputs(self.proto))
        missing = [n for n in self.input_names if n not in given]
        if missing:
            raise InputError(f"input(s) {', '.join(map(repr, missing))} not given; the model's inputs are: "
                             f"{', '.join(self._describe(vi) for vi in self.inputs)}")
        out = {}
        for vi in self.inputs:
            if given[vi.name] is None:  # numpy makes an object array of it: "got an array of object"
                raise InputError(f"input {vi.name!r}: got None, not an array; give {self._describe(vi)} an array")
            try:
                arr = np.asarray(given[vi.name])
            except ValueError as e:
                raise InputError(f"input {vi.name!r}: expected an array, got a {type(given[vi.name]).__name__} that "
                                 f"numpy cannot make one of ({e})") from None
            elem = vi.type.tensor_type.elem_type
            if elem and elem not in ELEM_DTYPE and elem not in COMPUTED_IN_F32:
                out[vi.name] = arr  # a type eggfuse does not run: the import refuses it, listing every op it cannot run
                continue
            want = elem_numpy(elem) if elem else arr.dtype
            if elem and not takes_kind(elem, arr.dtype):
                hint = f"; give it as {want.name} (numpy: arr.astype({want.name!r}))" if want.kind in "biuf" else ""
                raise InputError(f"input {vi.name!r}: the model takes {elem_name(elem)}, got an array of "
                                 f"{arr.dtype}{hint}")
            self._check_declared_shape(vi, arr.shape)
            if elem in COMPUTED_IN_F32 or (want.kind == "f" and arr.dtype != want):
                out[vi.name] = _feed_f32(arr, vi.name, elem)  # computed in float32
            else:
                out[vi.name] = arr
        return out

    def _check_declared_shape(self, vi: onnx.ValueInfoProto, shape: tuple[int, ...]) -> None:
        # InputError for a feed whose rank or fixed dimensions differ from the input's declared shape (as
        # onnxruntime refuses it); a symbolic or unknown dimension takes any size. Shapes given to the Model
        # (``shapes``) are checked by specialise instead.
        what = None if vi.name in self.shapes else declared_mismatch(vi, shape)
        if what:
            raise InputError(f"input {vi.name!r}: fed an array of shape {list(shape)} ({what}), but the model declares "
                             f"{self._describe(vi)}; feed an array of that shape (named dimensions take any size)")

    def _describe(self, vi: onnx.ValueInfoProto) -> str:
        # 'x' (FLOAT [batch, 3]): an input's name, element type and shape (as given in ``shapes``, else as declared: a
        # name for a symbolic dimension, ? for an unknown one)
        elem = vi.type.tensor_type.elem_type
        shape = str(list(self.shapes[vi.name])) if vi.name in self.shapes else declared_shape(vi)
        return f"{vi.name!r} ({elem_name(elem) if elem else 'any type'} {shape})"

    def run(self, feeds: Mapping[str, Any] | Sequence[Any]) -> list[np.ndarray]:
        """The model's outputs for ``feeds`` (name -> array, or arrays in input order), in output order
        and ONNX dtypes. A set of input shapes not seen before is imported and compiled first (one
        plan per set, kept). Raises :class:`~eggfuse.ir.InputError` for a missing or unknown input,
        a wrong dtype, a feed whose rank or fixed dimensions differ from the input's declared shape, a value out
        of int32's range, an integer or float64 value of a float input that float32 cannot hold, or
        (:class:`~eggfuse.ir.IndexRangeError`, naming the ONNX Gathers that index with the input) Gather indices
        outside their axis, and :class:`~eggfuse.ir.OnnxError` for other shapes the model does not take (the
        class's errors)."""
        feeds = self._feeds(feeds)
        spec = self.specialise(feeds)
        runtime = {n: a for n, a in feeds.items() if n not in spec.values}
        try:
            results = iter(spec.compiled.run(runtime) if spec.compiled is not None else ())
        except IndexRangeError as e:  # named by the ONNX nodes that index with the input
            readers = onnx_index_readers(self.proto.graph, e.input, e.rows)
            if not readers:
                raise
            raise IndexRangeError(f"{e} [ONNX node{'s' if len(readers) > 1 else ''} indexing with it: "
                                  f"{', '.join(readers)}]", input=e.input, index=e.index, rows=e.rows) from None
        out = []
        for v in spec.outputs:
            r = v.const.copy() if v.const is not None else next(results)
            with np.errstate(over="ignore"):  # a float16 output past 65504 is inf, as onnxruntime gives it
                out.append(np.asarray(r).astype(elem_numpy(v.elem), copy=False))
        return out

    def __repr__(self) -> str:
        return f"eggfuse.onnx.Model(inputs={self.input_names}, outputs={self.output_names}, plans={len(self.plans)})"
