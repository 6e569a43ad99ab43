"""egglog sorts of tensor graphs, and one constructor per IR op, named by the op.

Every op of :data:`eggfuse.ir.OPS` gets a constructor whose egglog name is the op's name
(``@function(egg_fn="RmsNorm")``), generated from its spec, so encoding, decoding, the cost
model and rules map e-nodes to ops by name and no second table lists ops. A constructor's
arguments are, in order:

- the op's egglog attributes (``OpSpec.egg_attrs``) in declaration order, typed by kind:
  int ``i64``, float ``f64``, str ``String``, bool ``Bool``, ints ``Vec[i64]``, floats
  ``Vec[f64]``, json a ``String`` of its JSON text;
- its tensor inputs, one ``T`` each; an op with a variadic tail (``"*name"``, Concat) takes
  one ``TList`` of them instead, and an op with optional inputs (``"name?"``) has one
  constructor per arity, named ``<Op>`` with every input and ``<Op>_<n>`` with n of them (a
  list would cost every rule that matches the op a join through its cells: the packed-QKV
  rule took 101 ms per 64-layer saturation with a list against 1 ms without);
- for an op with an epilogue attribute (the fused matmuls and convolutions) its store chain
  as an ``Epi`` term, whose binary steps carry the trailing inputs; ``Epi.ex(e, x)`` is a
  generated region (``ir/ops/fused_epilogue.py``), ``x`` an ``Ex`` term whose ``ExAcc(shape)``
  leaf is the chain's value so far and whose ``ExLeaf`` leaves carry the step's operands;
- for an op with an expression attribute (``Fused``, a generated elementwise kernel,
  ``ir/ops/fused.py``) its region as one ``Ex`` term and nothing else.

An ``Ex`` term is a region's value element by element: ``ExLeaf(t)`` reads tensor ``t``,
``ExConst(dtype, value, shape)`` is a scalar literal (its value as JSON text), and each op of
``ir.ops.fused.FUSABLE`` has a constructor ``Ex<Op>`` taking the op's egglog attributes, then
one ``Ex`` per operand (generated from the same table, so no op is listed twice).

Leaves are ``Input``/``Parameter``/``Constant(name, shape)``. ``TList`` (``Nil``/``Cons``)
also holds the graph's outputs, one root, so shared nodes are extracted once.

Analyses: ``shape(t)`` (a ``Vec[i64]``) is set at encoding for every graph node and read by
rule guards; ``is_bool(t)`` and ``is_i32(t)`` hold for every graph node of dtype bool and i32 (set
at encoding; f32, the common case, has no fact, which keeps the e-graph small); ``stored_uses(t)``
counts the consumers of a graph node that read it from memory (every op outside ``ir.ops.fused.FUSABLE``), plus one if
it is a graph output (set at encoding; summed when two encoded e-classes merge);
``epilogue_without_add(e)``, its complement ``epilogue_blocks_add(e)`` (the chain has an add or a
generated region: its own add step cannot take another addend), ``epilogue_without_region(e)`` (the
chain has only bias, add and unary steps) and ``last_step(e)`` are facts
about ``Epi`` chains derived by the
matmul family's analysis rules (``ir/ops/matmul.py``); each value fact of
``ir.facts`` (``value(t, v)``, ``causal_mask(t, offset)``, ...) is a relation of a tensor and
the fact's arguments, written at encoding for the constants it holds of (:data:`FACTS`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from egglog import (
    Bool,
    Expr,
    String,
    StringLike,
    Unit,
    Vec,
    f64,
    function,
    i64,
    method,
)

from ..ir import OPS
from ..ir.facts import VALUE_FACTS, ValueFact
from ..ir.ops.fused import FUSABLE
from ..ir.spec import Attr, OpSpec


class T(Expr, egg_sort="T"):
    """A tensor term: the value of one e-class."""


class Ex(Expr, egg_sort="Ex"):
    """A generated elementwise kernel's value, element by element (a region under ``Fused``)."""


class Epi(Expr, egg_sort="Epi"):
    """A matmul epilogue: steps applied in order to each output element at the store
    (innermost step first)."""

    @method(egg_fn="EpiNone")
    @classmethod
    def none(cls) -> Epi: ...

    @method(egg_fn="EpiBias")
    @classmethod
    def bias(cls, e: Epi, bias: T) -> Epi: ...

    @method(egg_fn="EpiAdd")
    @classmethod
    def add(cls, e: Epi, addend: T) -> Epi: ...

    @method(egg_fn="EpiAct")
    @classmethod
    def act(cls, e: Epi, op: StringLike) -> Epi: ...

    @method(egg_fn="EpiEx")
    @classmethod
    def ex(cls, e: Epi, x: Ex) -> Epi: ...


class TList(Expr, egg_sort="TList"):
    """A list of tensors: the graph outputs, or the inputs of a variadic op."""

    @method(egg_fn="Nil")
    @classmethod
    def nil(cls) -> TList: ...

    @method(egg_fn="Cons")
    @classmethod
    def cons(cls, head: T, tail: TList) -> TList: ...


@function(egg_fn="shape")
def shape(t: T) -> Vec[i64]: ...


@function(egg_fn="is_bool")
def is_bool(t: T) -> Unit: ...


@function(egg_fn="is_i32")
def is_i32(t: T) -> Unit: ...


@function(egg_fn="stored_uses", merge=lambda old, new: old + new)
def stored_uses(t: T) -> i64: ...


@function(egg_fn="epilogue_without_add")
def epilogue_without_add(e: Epi) -> Unit: ...


@function(egg_fn="epilogue_blocks_add")
def epilogue_blocks_add(e: Epi) -> Unit: ...


@function(egg_fn="epilogue_without_region")
def epilogue_without_region(e: Epi) -> Unit: ...


@function(egg_fn="last_step")
def last_step(e: Epi) -> String: ...


def _fact_relation(fact: ValueFact) -> Any:
    """The egglog relation of a value fact: ``name(t: T, *args) -> Unit``, declared with its name."""
    params = [inspect.Parameter("_t", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=T)]
    params += [inspect.Parameter(f"_a{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=ATTR_SORTS[kind])
               for i, kind in enumerate(fact.args)]

    def fn(*args): ...

    fn.__name__ = fn.__qualname__ = fact.name
    fn.__module__ = __name__
    fn.__signature__ = inspect.Signature(params, return_annotation=Unit)
    fn.__annotations__ = {p.name: p.annotation for p in params} | {"return": Unit}
    return function(egg_fn=fact.name)(fn)


#: egglog attribute sort of each value-fact argument kind.
ATTR_SORTS = {"int": i64, "float": f64, "str": String, "bool": Bool, "ints": Vec[i64], "floats": Vec[f64],
              "json": String}

#: Value fact name -> its egglog relation (``ir.facts``; rules read them as ``e.<name>(t, ...)``).
FACTS: dict[str, Any] = {name: _fact_relation(fact) for name, fact in VALUE_FACTS.items()}

#: The analysis functions: facts, not e-nodes (excluded from e-node counts and extraction).
ANALYSES = (shape, is_bool, is_i32, stored_uses, epilogue_without_add, epilogue_blocks_add, epilogue_without_region,
            last_step, *FACTS.values())


@dataclass(frozen=True)
class Signature:
    """How an e-node of ``op`` is laid out by constructor ``name``: ``attrs`` (egglog
    attributes, in argument order), ``tensors`` (the number of ``T`` arguments after them;
    None: one ``TList``), ``epilogue`` (a trailing ``Epi`` argument), ``leaf`` (``name,
    shape``) and ``expr`` (one ``Ex`` argument only: ``Fused``)."""

    name: str
    op: str
    attrs: tuple[Attr, ...]
    tensors: int | None
    epilogue: bool
    leaf: bool
    expr: bool = False

    @property
    def arg_sorts(self) -> tuple[str, ...]:
        """The sort of each argument: an attribute kind, "T", "TList", "Epi" or "Ex"."""
        if self.leaf:
            return ("str", "ints")
        if self.expr:
            return ("Ex",)
        tail = ("TList",) if self.tensors is None else ("T",) * self.tensors
        return (*(a.kind for a in self.attrs), *tail, *(("Epi",) if self.epilogue else ()))


def signatures(spec: OpSpec) -> list[Signature]:
    """The constructors of one op: one, or one per arity for an op with optional inputs."""
    if spec.leaf:
        return [Signature(spec.name, spec.name, (), 0, False, True)]
    if spec.expr_attr is not None:
        return [Signature(spec.name, spec.name, (), 0, False, False, expr=True)]
    if spec.epilogue_attr is not None:  # fixed inputs as T, the operands in the chain
        return [Signature(spec.name, spec.name, spec.egg_attrs, spec.min_inputs, True, False)]
    if any(n.startswith("*") for n in spec.inputs):
        return [Signature(spec.name, spec.name, spec.egg_attrs, None, False, False)]
    full = len(spec.inputs)
    return [Signature(spec.name if n == full else f"{spec.name}_{n}", spec.name, spec.egg_attrs, n, False, False)
            for n in range(spec.min_inputs, full + 1)]


def constructor_name(op: str, n_inputs: int) -> str:
    """The constructor of an ``op`` node with ``n_inputs`` inputs."""
    name = f"{op}_{n_inputs}"
    return name if name in SIGNATURES else op


def _constructor(sig: Signature) -> Any:
    """The egglog function of one op, declared with the op's name (egglog-python's public
    ``@function(egg_fn=...)`` applied to a generated Python signature)."""
    sorts = {"T": T, "TList": TList, "Epi": Epi, "Ex": Ex, **ATTR_SORTS}
    names = [a.name for a in sig.attrs] if not sig.leaf else ["name", "shape"]
    return _declare(sig.name, [sorts[kind] for kind in sig.arg_sorts], names, T)


def _declare(name: str, arg_sorts: list, names: list[str], result: Any) -> Any:
    """The egglog function ``name``: arguments of ``arg_sorts`` (the first named ``names``,
    the rest ``t0``...), of sort ``result``."""
    params = []
    for i, sort in enumerate(arg_sorts):
        pname = names[i] if i < len(names) else f"t{i - len(names)}"
        params.append(inspect.Parameter(f"_{pname}", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=sort))

    def fn(*args): ...

    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = __name__
    fn.__signature__ = inspect.Signature(params, return_annotation=result)
    fn.__annotations__ = {p.name: p.annotation for p in params} | {"return": result}
    return function(egg_fn=name)(fn)


#: Constructor name -> its Signature, for every op of OPS (``Signature.op`` names the op).
SIGNATURES: dict[str, Signature] = {sig.name: sig for spec in OPS.values() for sig in signatures(spec)}

#: Constructor name -> its egglog function.
CONSTRUCTORS: dict[str, Any] = {name: _constructor(sig) for name, sig in SIGNATURES.items()}

#: ``ExLeaf(t)``: a region reads tensor ``t``; ``ExConst(dtype, value, shape)``: a scalar literal.
#: (Declared like the op constructors, so egglog's serialisation names them as egglog does.)
ex_leaf = _declare("ExLeaf", [T], ["t"], Ex)
ex_const = _declare("ExConst", [String, String, Vec[i64]], ["dtype", "value", "shape"], Ex)
#: ``ExAcc(shape)``: the accumulator of a generated epilogue region (``Epi.ex``), f32 of ``shape``.
ex_acc = _declare("ExAcc", [Vec[i64]], ["shape"], Ex)


@dataclass(frozen=True)
class ExSignature:
    """The ``Ex`` constructor ``name`` (``Ex<op>``) of a fusable op: its egglog ``attrs``, then
    ``arity`` ``Ex`` operands."""

    name: str
    op: str
    attrs: tuple[Attr, ...]
    arity: int

    @property
    def arg_sorts(self) -> tuple[str, ...]:
        return (*(a.kind for a in self.attrs), *("Ex",) * self.arity)


#: ``Ex`` constructor name -> its ExSignature, one per op of FUSABLE.
EX_SIGNATURES: dict[str, ExSignature] = {f"Ex{f.op}": ExSignature(f"Ex{f.op}", f.op, OPS[f.op].egg_attrs, f.arity)
                                         for f in FUSABLE.values()}

#: Op name -> the egglog function of its ``Ex`` constructor.
EX_CONSTRUCTORS: dict[str, Any] = {
    sig.op: _declare(name, [ATTR_SORTS[a.kind] for a in sig.attrs] + [Ex] * sig.arity,
                     [a.name for a in sig.attrs], Ex) for name, sig in EX_SIGNATURES.items()}

#: Argument sorts of the structural constructors (by their Python display names in egglog's
#: serialisation) and of every op's constructors (by constructor name).
ARG_SORTS: dict[str, tuple[str, ...]] = {
    "Epi.none": (), "Epi.bias": ("Epi", "T"), "Epi.add": ("Epi", "T"), "Epi.act": ("Epi", "str"),
    "Epi.ex": ("Epi", "Ex"), "ExAcc": ("ints",),
    "TList.nil": (), "TList.cons": ("T", "TList"), "ExLeaf": ("T",), "ExConst": ("str", "str", "ints"),
    **{name: sig.arg_sorts for name, sig in SIGNATURES.items()},
    **{name: sig.arg_sorts for name, sig in EX_SIGNATURES.items()},
}

#: The sorts whose e-nodes extraction chooses among (the rest are literals and analyses).
CHILD_SORTS = ("T", "Epi", "TList", "Ex")

__all__ = ["ANALYSES", "ARG_SORTS", "ATTR_SORTS", "CHILD_SORTS", "CONSTRUCTORS", "EX_CONSTRUCTORS", "EX_SIGNATURES",
           "FACTS", "SIGNATURES", "Epi", "Ex", "ExSignature", "Signature", "T", "TList", "constructor_name",
           "epilogue_blocks_add", "epilogue_without_add", "epilogue_without_region", "ex_acc", "ex_const", "ex_leaf",
           "is_bool", "is_i32", "last_step", "shape", "stored_uses"]
