"""egglog sorts of tensor graphs, and one constructor per IR op, named by the op.

Every op of :data:`eggfuse.ir.OPS` gets a constructor whose egglog name is the op's name
(``@function(egg_fn="RmsNorm")``), generated from its spec, so encoding, decoding, the cost
model and rules map e-nodes to ops by name and no second table lists ops. A constructor's
arguments are, in order:

- the op's egglog attributes (``OpSpec.egg_attrs``) in declaration order, typed by kind:
  int ``i64``, float ``f64``, str ``String``, bool ``Bool``, ints ``Vec[i64]``, floats
  ``Vec[f64]``;
- its tensor inputs, one ``T`` each, or for an op whose number of inputs varies
  (``OpSpec.variadic``) one ``TList`` of them;
- for an op with an epilogue attribute (the fused matmuls) its store chain as an ``Epi``
  term, whose binary steps carry the trailing inputs.

Leaves are ``Input``/``Parameter``/``Constant(name, shape)``. ``TList`` (``Nil``/``Cons``)
also holds the graph's outputs, one root, so shared nodes are extracted once.

Analyses: ``shape(t)`` (a ``Vec[i64]``) is set at encoding for every graph node and read by
rule guards; ``epilogue_without_add(e)`` and ``last_step(e)`` are facts about ``Epi`` chains
derived by the matmul family's analysis rules (``ir/ops/matmul.py``).
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
from ..ir.spec import Attr, OpSpec


class T(Expr, egg_sort="T"):
    """A tensor term: the value of one e-class."""


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


@function(egg_fn="epilogue_without_add")
def epilogue_without_add(e: Epi) -> Unit: ...


@function(egg_fn="last_step")
def last_step(e: Epi) -> String: ...


#: The analysis functions: facts, not e-nodes (excluded from e-node counts and extraction).
ANALYSES = (shape, epilogue_without_add, last_step)

#: egglog sort of each attribute kind.
ATTR_SORTS = {"int": i64, "float": f64, "str": String, "bool": Bool, "ints": Vec[i64], "floats": Vec[f64]}


@dataclass(frozen=True)
class Signature:
    """How an op's e-node is laid out: ``attrs`` (egglog attributes, in argument order),
    ``tensors`` (the number of ``T`` arguments after them; None: one ``TList``), ``epilogue``
    (a trailing ``Epi`` argument) and ``leaf`` (``name, shape``)."""

    op: str
    attrs: tuple[Attr, ...]
    tensors: int | None
    epilogue: bool
    leaf: bool

    @property
    def arg_sorts(self) -> tuple[str, ...]:
        """The sort of each argument: an attribute kind, "T", "TList" or "Epi"."""
        if self.leaf:
            return ("str", "ints")
        tail = ("TList",) if self.tensors is None else ("T",) * self.tensors
        return (*(a.kind for a in self.attrs), *tail, *(("Epi",) if self.epilogue else ()))


def signature(spec: OpSpec) -> Signature:
    if spec.leaf:
        return Signature(spec.name, (), 0, False, True)
    epilogue = spec.epilogue_attr is not None
    if epilogue:  # fixed inputs as T, the operands in the chain
        tensors: int | None = spec.min_inputs
    else:
        tensors = None if spec.variadic else spec.min_inputs
    return Signature(spec.name, spec.egg_attrs, tensors, epilogue, False)


def _constructor(sig: Signature) -> Any:
    """The egglog function of one op, declared with the op's name (egglog-python's public
    ``@function(egg_fn=...)`` applied to a generated Python signature)."""
    sorts = {"T": T, "TList": TList, "Epi": Epi, **ATTR_SORTS}
    names = [a.name for a in sig.attrs] if not sig.leaf else ["name", "shape"]
    kinds = sig.arg_sorts
    params = []
    for i, kind in enumerate(kinds):
        pname = names[i] if i < len(names) else f"t{i - len(names)}"
        params.append(inspect.Parameter(f"_{pname}", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                        annotation=sorts[kind]))

    def fn(*args): ...

    fn.__name__ = fn.__qualname__ = sig.op
    fn.__module__ = __name__
    fn.__signature__ = inspect.Signature(params, return_annotation=T)
    fn.__annotations__ = {p.name: p.annotation for p in params} | {"return": T}
    return function(egg_fn=sig.op)(fn)


#: Op name -> its Signature, for every op of OPS.
SIGNATURES: dict[str, Signature] = {name: signature(spec) for name, spec in OPS.items()}

#: Op name -> its egglog constructor.
CONSTRUCTORS: dict[str, Any] = {name: _constructor(sig) for name, sig in SIGNATURES.items()}

#: Argument sorts of the structural constructors (by their Python display names in egglog's
#: serialisation) and of every op's constructor (by op name).
ARG_SORTS: dict[str, tuple[str, ...]] = {
    "Epi.none": (), "Epi.bias": ("Epi", "T"), "Epi.add": ("Epi", "T"), "Epi.act": ("Epi", "str"),
    "TList.nil": (), "TList.cons": ("T", "TList"),
    **{name: sig.arg_sorts for name, sig in SIGNATURES.items()},
}

#: The sorts whose e-nodes extraction chooses among (the rest are literals and analyses).
CHILD_SORTS = ("T", "Epi", "TList")

__all__ = ["ANALYSES", "ARG_SORTS", "ATTR_SORTS", "CHILD_SORTS", "CONSTRUCTORS", "SIGNATURES", "Epi", "Signature",
           "T", "TList", "epilogue_without_add", "last_step", "shape"]
