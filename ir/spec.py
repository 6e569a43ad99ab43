"""The op spec: everything eggfuse knows about one op kind, in one block.

An :class:`OpSpec` gives, for one op: its inputs and typed attributes, its shape rule, its
float64 numpy reference with the formula's source, its vector-Jacobian product (or the
:data:`NO_GRAD` marker), its cost facts (FLOPs; bytes follow from the types), its kernel
builder (a function returning :class:`~.kernel.Kernel` descriptions, which lowering renders
to WGSL), and the rewrite rules that introduce or simplify it (:func:`rules`). The family
modules of :mod:`eggfuse.ir.ops` hold one such block per op; everything downstream derives
its tables from :data:`OPS`: the egglog constructors and their encoding and decoding
(``rewrites/``), the cost model, the kernel table (``lowering/``) and autodiff.

Nothing here imports a later stage: a kernel builder returns plain data, and a rule function
receives the rewrite engine's egglog namespace as its argument (:class:`RuleGroup`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .types import DType, TensorType


class ShapeError(ValueError):
    """Raised by a shape rule; the graph builder adds node, op and shapes to it."""


def need(cond: bool, msg: str) -> None:
    """Raise :class:`ShapeError` with ``msg`` unless ``cond``: the shape rules' one check."""
    if not cond:
        raise ShapeError(msg)


def need_axes(axes: Sequence[int], t: TensorType, what: str = "axis") -> None:
    """Raise :class:`ShapeError` unless each of ``axes`` is an axis of ``t`` counted from 0 (0 .. rank - 1), as the
    ops that call this take them (the ONNX importer turns ONNX's negative axes into these): ``what`` names them in the
    message ("axis" shows the one, "axes" the list), which says how to write a negative one."""
    if all(0 <= a < t.rank for a in axes):
        return
    shown = axes[0] if what == "axis" else list(axes)
    hint = (f"; this op counts axes from 0 (0..{t.rank - 1} here): write axis + rank for a negative one "
            f"(-1 is {t.rank - 1})" if any(a < 0 for a in axes) and t.rank else "")
    raise ShapeError(f"{what} {shown} out of range for {t}{hint}")


def need_f32(t: TensorType, what: str) -> None:
    if t.dtype is not DType.F32:  # the message only when raised: shape rules run for every e-node priced
        raise ShapeError(f"{what} must be f32, got {t}")


class BelowMinimum(ValueError):
    """An attribute's value below its :attr:`Attr.minimum` (a norm's negative epsilon)."""


#: An attribute without a default must be given.
REQUIRED = object()

#: Attribute kinds and the Python type each value is normalised to. "json" is None, a number, a
#: string or a tuple of them (nested), encoded in egglog as its JSON text (RoPE's ``scaling``);
#: "epilogue" is a tuple of step names and ``("expr", steps)`` regions (a fused matmul's store
#: chain, ``ir/ops/fused_epilogue.py``; encoded in egglog as an ``Epi`` term); "expr" is a
#: generated elementwise kernel's expression (a tuple of steps, see ``ir/ops/fused.py``; in
#: egglog an ``Ex`` term); "array" and "type" belong to leaves and never
#: enter the e-graph.
ATTR_KINDS = ("int", "float", "str", "bool", "ints", "floats", "json", "epilogue", "expr", "array", "type")


def json_value(value: Any) -> Any:
    """``value`` as a canonical "json" attribute: tuples for lists, finite floats; ValueError else."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not finite")
        return float(value)
    if isinstance(value, list | tuple):
        return tuple(json_value(v) for v in value)
    raise ValueError(f"{value!r} is not None, a number, a string or a tuple of them")


def _tuples(value: Any) -> Any:
    # lists (from JSON, or written by hand) as tuples, all the way down: an "expr" is hashable
    if isinstance(value, list | tuple):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    return value


@dataclass(frozen=True)
class Attr:
    """One attribute of an op: ``name``, ``kind`` (one of :data:`ATTR_KINDS`), ``default``."""

    name: str
    kind: str
    default: Any = REQUIRED
    doc: str = ""
    #: the least value a "float" or "int" attribute takes (a norm's epsilon: 0), None for any
    minimum: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ATTR_KINDS:
            raise ValueError(f"attribute {self.name}: unknown kind {self.kind!r}")

    def normalise(self, value: Any) -> Any:
        """``value`` as this attribute's canonical Python value; ValueError/TypeError if it is not one."""
        k = self.kind
        if k == "int":
            if isinstance(value, bool) or int(value) != value:
                raise ValueError(f"{value!r} is not an integer")
            if self.minimum is not None and int(value) < self.minimum:
                raise BelowMinimum(f"{self.name} must be at least {self.minimum:g}, got {value!r}")
            return int(value)
        if k == "float":
            if isinstance(value, str | bytes):
                raise TypeError(f"{value!r} is a string, not a number")
            v = float(value)
            if not math.isfinite(v):
                raise ValueError(f"{value!r} is not finite")
            if self.minimum is not None and v < self.minimum:
                raise BelowMinimum(f"{self.name} must be at least {self.minimum:g}, got {value!r}")
            return v
        if k == "str":
            if not isinstance(value, str):
                raise TypeError(f"{value!r} is not a string")
            return value
        if k == "bool":
            if not isinstance(value, bool | np.bool_):
                raise TypeError(f"{value!r} is not a bool")
            return bool(value)
        if k == "ints":
            out = tuple(int(v) for v in value)
            if any(o != v for o, v in zip(out, value, strict=True)):
                raise ValueError(f"{value!r} is not a sequence of integers")
            return out
        if k == "floats":
            if isinstance(value, str | bytes) or any(isinstance(v, str | bytes) for v in value):
                raise TypeError(f"{value!r} is not a sequence of numbers")
            return tuple(float(v) for v in value)
        if k == "json":
            return json_value(value)
        if k == "expr":
            return _tuples(value)
        if k == "epilogue":
            if isinstance(value, str):
                raise TypeError(f"{value!r} is one string; the steps are a sequence of step names, e.g. ({value!r},)")
            out = tuple(s if isinstance(s, str) else _tuples(s) for s in value)
            if not all(isinstance(s, str) or (len(s) == 2 and s[0] == "expr") for s in out):
                raise TypeError(f"{value!r} is not a sequence of step names and ('expr', steps) regions")
            return out
        return value


class _NoGrad:
    """The marker of an op with no gradient rule: gradient ops, updates, piecewise-constant ops
    are differentiated only where the marker's reason allows (see :func:`grad`)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"NO_GRAD({self.reason!r})"


def no_grad(reason: str) -> _NoGrad:
    """The VJP field of an op that has no gradient, with the reason autodiff gives."""
    return _NoGrad(reason)


NO_GRAD = no_grad("it computes a gradient or updates state; eggfuse has no second derivatives")

ShapeRule = Callable[[list[TensorType], dict[str, Any]], TensorType]
Reference = Callable[[list[np.ndarray], dict[str, Any]], np.ndarray]


@dataclass(frozen=True, eq=False)
class OpSpec:
    """How one op kind behaves in every stage.

    - ``inputs``: input names in order. ``"name?"`` marks an optional trailing input and
      ``"*name"`` a variadic tail (any number, ``max_inputs`` at most when given). Names are
      used in messages and as the kernel's default binding names.
    - ``attrs``: the typed attributes (:class:`Attr`); values are normalised on ``add_node``.
    - ``infer(types, attrs) -> TensorType``: the shape rule, raising :class:`ShapeError`.
    - ``reference(values, attrs) -> ndarray``: the float64 numpy semantics, the oracle of
      every test; ``doc`` names the formula's source.
    - ``vjp(b, node, dy, want) -> grads``: the vector-Jacobian rule (see ``ir.autodiff``),
      or a :func:`no_grad` marker. ``vjp_takes_one``: the rule folds a loss seed of one.
    - ``kernel(node, ins, target) -> Kernel | list[Kernel]``: the lowering (``ir.kernel``);
      None for ops that need no dispatch (``dispatches`` 0: leaves, views).
    - ``flops(ins, out, attrs) -> int``: floating-point operations of one run (default:
      one per output element).
    - ``writes``: index of an input the op updates in place (its value is that input's new
      contents, in the same buffer).
    - ``updates``: indices of inputs (state tensors) the op also updates in place as a side
      effect, its value being something else (an attention that appends its new keys and
      values to the KV cache it reads). Such an op never reads the contents it writes (it has
      them as inputs), so two of them updating the same contents need no order between them.
      Lowering runs every other reader of their old contents first, and their kernels bind
      them ``read_write``; the reference's value is the op's own, computed from the updated
      contents where the op says so.
    - ``epilogue_step``: a unary elementwise op a fused matmul may apply at its store.
    - ``packs_parameters``: a node of this op whose inputs are all parameters is a derived
      parameter, packed once when a session is created (``Graph.is_derived_parameter``): its
      inputs concatenated along its ``axis`` attribute (0 without one), then stored as
      ``pack_store`` says: ``"f32"`` as they are, ``"f16"`` rounded to float16 two a word
      (``ir/ops/half.py``).
    - ``leaf``: Input, Parameter and Constant, fed or uploaded rather than computed.
    - ``view``: the op's value is its first input's bytes seen with another shape (a reshape):
      lowering gives it that input's buffer and no dispatch.
    - ``view_offset(ins, attrs) -> bytes``: for a view of part of its input (``Select``), where that
      part begins in the input's bytes, a multiple of :data:`VIEW_ALIGN`; lowering binds the view as
      a window of the input's buffer from there (None: from byte 0).
    - ``fallback``: a general kernel for what specialised ops do not cover (GeneralAttention):
      extraction prices its e-nodes one byte-equivalent above their kernel's cost, so that of
      two choices of equal cost the specialised op is taken (rewrites.problem).
    - ``read_bytes(ins, attrs) -> bytes``: for an op that reads only part of an input (a column window of a
      packed product), the bytes it reads; the cost model charges those (default: every input whole).
    - ``moves``: every element of the op's value is a copy of an element of its inputs, which are all data
      (Transpose, Slice, Concat, Expand, ...; views move too): the runtime's index checks follow indices
      through such ops to the input they come from (``Graph.index_reads``), and the op's reference, run on
      element numbers, tells which of that input's elements are read (``Graph.index_positions``).
    - ``index_bounds(ins, attrs) -> {input slot: rows}``: the index inputs the op reads and
      the bound of their values: u32 ones in [0, rows) (an Embedding's table rows), i32 ones
      (ONNX Gather's, negative from the end) in [-rows, rows); ``rows`` a tuple bounds the elements
      at each position along the input's last axis apart (GatherND's index tuples). The runtime
      refuses a fed index outside, as the reference (u32) and onnxruntime (i32) do.
    """

    name: str
    inputs: tuple[str, ...]
    infer: ShapeRule
    reference: Reference | None
    attrs: tuple[Attr, ...] = ()
    doc: str = ""
    vjp: Any = None
    vjp_takes_one: bool = False
    kernel: Callable | None = None
    dispatches: int = 1
    flops: Callable[[list[TensorType], TensorType, dict[str, Any]], int] | None = None
    writes: int | None = None
    updates: tuple[int, ...] = ()
    epilogue_step: bool = False
    packs_parameters: bool = False
    pack_store: str = "f32"
    leaf: bool = False
    view: bool = False
    view_offset: Callable[[list[TensorType], dict[str, Any]], int] | None = None
    moves: bool = False
    read_bytes: Callable[[list[TensorType], dict[str, Any]], int] | None = None
    fallback: bool = False
    index_bounds: Callable[[list[TensorType], dict[str, Any]], dict[int, int | tuple[int, ...]]] | None = None
    max_inputs: int | None = None
    family: str = ""

    # --- derived facts -------------------------------------------------------------------

    @property
    def fixed_inputs(self) -> tuple[str, ...]:
        return tuple(n for n in self.inputs if not n.endswith("?") and not n.startswith("*"))

    @property
    def written_inputs(self) -> tuple[int, ...]:
        """The inputs the op updates in place: ``writes`` (if any), then ``updates``."""
        return ((self.writes,) if self.writes is not None else ()) + self.updates

    @property
    def min_inputs(self) -> int:
        return len(self.fixed_inputs)

    @property
    def variadic(self) -> bool:
        """True when the number of inputs varies (optional or variadic inputs)."""
        return any(n.endswith("?") or n.startswith("*") for n in self.inputs)

    @property
    def input_limit(self) -> int | None:
        """Most inputs the op takes (None: no limit)."""
        if any(n.startswith("*") for n in self.inputs):
            return self.max_inputs
        return len(self.inputs)

    def input_name(self, i: int) -> str:
        """The name of input ``i`` (``name3`` for the fourth input of a ``*name`` tail)."""
        fixed = [n.rstrip("?") for n in self.inputs if not n.startswith("*")]
        if i < len(fixed):
            return fixed[i]
        tail = next(n[1:] for n in self.inputs if n.startswith("*"))
        return f"{tail}{i - len(fixed)}"

    def attr(self, name: str) -> Attr:
        for a in self.attrs:
            if a.name == name:
                return a
        raise KeyError(name)

    @property
    def attr_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attrs)

    @property
    def egg_attrs(self) -> tuple[Attr, ...]:
        """The attributes that are arguments of the op's egglog constructor, in order."""
        return tuple(a for a in self.attrs if a.kind not in ("array", "type", "epilogue", "expr"))

    @property
    def epilogue_attr(self) -> Attr | None:
        return next((a for a in self.attrs if a.kind == "epilogue"), None)

    @property
    def expr_attr(self) -> Attr | None:
        return next((a for a in self.attrs if a.kind == "expr"), None)

    @property
    def differentiable(self) -> bool:
        return callable(self.vjp)

    def count_flops(self, ins: Sequence[TensorType], out: TensorType, attrs: dict[str, Any]) -> int:
        if self.flops is None:
            return out.num_elements if self.dispatches else 0
        return int(self.flops(list(ins), out, attrs))


#: Bytes a view's offset into its input is a multiple of (``OpSpec.view_offset``): WebGPU's largest
#: minStorageBufferOffsetAlignment (its default; a device may only lower it), so that every device binds it.
VIEW_ALIGN = 256

#: Op name -> spec, in registration order (family by family, in the order ``ir.ops`` imports them).
OPS: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    """Add ``spec`` to :data:`OPS`; ValueError if its name is taken."""
    if spec.name in OPS:
        raise ValueError(f"op {spec.name} registered twice")
    OPS[spec.name] = spec
    return spec


def op(name: str, inputs: Sequence[str], infer: ShapeRule, reference: Reference | None, **fields: Any) -> OpSpec:
    """Register an :class:`OpSpec` (``family`` from the calling module's ``FAMILY``)."""
    import sys

    caller = sys._getframe(1).f_globals
    fields.setdefault("family", caller.get("FAMILY", ""))
    return register(OpSpec(name, tuple(inputs), infer, reference, **fields))


# --- rules as data ------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleGroup:
    """Rules of one ruleset written beside the ops they concern.

    ``fn(e)`` receives the rewrite engine's egglog namespace (``rewrites.dsl.Namespace``:
    constructors by op name, sorts, analyses and egglog's rule primitives) and yields egglog
    rules, each made with ``e.equal(name, lhs, rhs, *guards, example=...)`` or ``e.rule``.
    ``ruleset`` names the ruleset (the schedule lists them, ``rewrites.rulesets``);
    ``"analysis"`` rules derive facts and run to saturation between optimisation passes.
    """

    ruleset: str
    fn: Callable[[Any], Iterable[Any]]
    family: str = ""


#: Every rule group, in registration order.
RULES: list[RuleGroup] = []


def rules(ruleset: str) -> Callable[[Callable], Callable]:
    """Decorator: register the decorated function as a :class:`RuleGroup` of ``ruleset``."""
    import sys

    family = sys._getframe(1).f_globals.get("FAMILY", "")

    def deco(fn: Callable) -> Callable:
        RULES.append(RuleGroup(ruleset, fn, family))
        return fn

    return deco


@dataclass(frozen=True)
class Example:
    """A soundness example of a rule: ``build(g, dim)`` adds nodes and outputs to the empty
    graph ``g``; ``dim(name, lo=1, hi=max)`` draws a size, the same for the same name. ``tol``
    (relative and absolute) is None for a rule that is an equality (checked to float64
    rounding), else the error the rule may add: the rules of the ``f16`` ruleset round weights."""

    build: Callable[[Any, Callable[..., int]], None]
    max_dim: int = 7
    tol: float | None = None


def example(build: Callable[[Any, Callable[..., int]], None], max_dim: int = 7, tol: float | None = None) -> Example:
    return Example(build, max_dim, tol)


__all__ = [
    "ATTR_KINDS", "NO_GRAD", "OPS", "REQUIRED", "RULES", "VIEW_ALIGN", "Attr", "Example", "OpSpec", "RuleGroup",
    "ShapeError", "example", "need", "need_f32", "no_grad", "op", "register", "rules",
]

