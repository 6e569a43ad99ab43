"""The extraction problem read from a saturated e-graph: e-classes, candidate e-nodes, costs.

egglog serialises the e-graph (e-nodes with their e-class and children); this module keeps
the e-nodes of the tensor, epilogue and list sorts reachable from the outputs, gives every
tensor e-class its type (from the ``shape`` facts set at encoding; for an e-class a rule
created, from the IR's shape rule applied to an e-node of it: the IR stays the only
authority on shapes), checks every other reachable e-node against its e-class's type (a
rule's right side has no shape fact, so egglog lets an unsound rule join terms of different
shapes), prices each e-node under the cost model and turns a choice of one
e-node per e-class into a :class:`~.extract.TermDag`. Both the greedy and the ILP extractor
solve this problem.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from ..ir import OPS, DType, RewriteError, TensorType
from ..ir.ops.fused import FUSABLE
from ..ir.spec import ShapeError, json_value
from . import egglog_private
from .cost import CostModel, KernelInfo, checked_cost, epilogue_operand_info, fused_read_info, kernel_info
from .encode import Encoding
from .extract import TermDag
from .sorts import ARG_SORTS, CHILD_SORTS, EX_SIGNATURES, SIGNATURES


def decode(raw: dict) -> tuple[dict, dict, dict]:
    """(e-class of each node id, candidate e-nodes of each e-class, literal op of each primitive e-class)."""
    nodes = raw["nodes"]
    cls = {nid: n["eclass"] for nid, n in nodes.items()}
    value = {n["eclass"]: n["op"] for nid, n in nodes.items() if nid.startswith("primitive-") and not n["children"]}
    members: dict[str, list[str]] = {}
    for nid, n in nodes.items():
        if n["op"] in ARG_SORTS and not nid.startswith("primitive-"):
            members.setdefault(n["eclass"], []).append(nid)
    return cls, members, value


def literal(nodes: dict, node_id: str, kind: str):
    """The Python value of a literal argument of attribute ``kind`` (``ir.spec.ATTR_KINDS``)."""
    node = nodes[node_id]
    op = node["op"]
    if kind == "ints":
        return tuple(int(nodes[g]["op"]) for g in node["children"])
    if kind == "floats":
        return tuple(float(nodes[g]["op"]) for g in node["children"])
    if kind == "int":
        return int(op)
    if kind == "float":
        return float(op)
    if kind == "bool":
        return op == "true"
    if kind == "json":
        return json_value(json.loads(json.loads(op)))
    return json.loads(op)


@dataclass
class ENode:
    """One decoded e-node: ``op``, its attributes, its tensor inputs as e-classes in input order
    (variadic lists and epilogue operands flattened; a fused matmul's epilogue steps among the
    attributes), and for a generated kernel (``Fused``) the e-class of its ``Ex`` term, ``ex``."""

    op: str
    attrs: dict
    inputs: list[str]
    ex: str | None = None


@dataclass
class ExNode:
    """One decoded ``Ex`` e-node: ``op`` "leaf" (``args``: the tensor e-class read), "const"
    (``attrs``: dtype, shape, value) or a fusable op (``attrs`` its attributes, ``args`` its
    operands' ``Ex`` e-classes)."""

    op: str
    attrs: dict
    args: list[str]


class Decoder:
    """Reads e-nodes of egglog's serialisation as IR ops (shared by extraction and the soundness check)."""

    def __init__(self, raw: dict) -> None:
        self.raw = raw
        self.nodes = raw["nodes"]
        self.cls, self.members, self.value = decode(raw)

    def args(self, nid: str) -> list[tuple[str, str]]:
        """(sort, child node id) of each argument of e-node ``nid``."""
        n = self.nodes[nid]
        return list(zip(ARG_SORTS[n["op"]], n["children"], strict=True))

    def first(self, eclass: str) -> str:
        return self.members[eclass][0]

    def tensor_list(self, eclass: str) -> list[str]:
        """The tensor e-classes of a ``TList`` e-class, in order."""
        out = []
        while True:
            n = self.nodes[self.first(eclass)]
            if n["op"] == "TList.nil":
                return out
            out.append(self.cls[n["children"][0]])
            eclass = self.cls[n["children"][1]]

    def epilogue(self, eclass: str) -> tuple[list[str], list[str]]:
        """Steps (innermost first) and operand e-classes of an ``Epi`` e-class; a generated region
        (``Epi.ex``) is the step ``("ex", its Ex e-class)``, with no operands here."""
        steps, operands = [], []
        while (n := self.nodes[self.first(eclass)])["op"] != "Epi.none":
            inner, arg = n["children"]
            if n["op"] == "Epi.act":
                steps.append(json.loads(self.nodes[arg]["op"]))
            elif n["op"] == "Epi.ex":  # a generated region: its Ex e-class (its reads are its ExLeaf e-nodes')
                steps.append(("ex", self.cls[arg]))
            else:
                steps.append("bias" if n["op"] == "Epi.bias" else "add")
                operands.append(self.cls[arg])
            eclass = self.cls[inner]
        return steps[::-1], operands[::-1]

    def ex_node(self, nid: str) -> ExNode:
        """e-node ``nid`` of an ``Ex`` e-class."""
        n = self.nodes[nid]
        if n["op"] == "ExLeaf":
            return ExNode("leaf", {}, [self.cls[n["children"][0]]])
        if n["op"] == "ExAcc":
            return ExNode("acc", {"shape": literal(self.nodes, n["children"][0], "ints")}, [])
        if n["op"] == "ExConst":
            dtype, value, shape = (literal(self.nodes, ch, kind)
                                   for ch, kind in zip(n["children"], ARG_SORTS["ExConst"], strict=True))
            return ExNode("const", {"dtype": dtype, "value": json.loads(value), "shape": shape}, [])
        sig = EX_SIGNATURES[n["op"]]
        attrs, args = {}, []
        for (sort, child), attr in zip(self.args(nid), (*sig.attrs, *([None] * sig.arity)), strict=True):
            if sort == "Ex":
                args.append(self.cls[child])
            else:
                attrs[attr.name] = literal(self.nodes, child, sort)
        return ExNode(sig.op, attrs, args)

    def enode(self, nid: str) -> ENode:
        """e-node ``nid`` of a tensor e-class as an IR op application."""
        n = self.nodes[nid]
        sig = SIGNATURES[n["op"]]
        op = sig.op
        if sig.leaf:
            return ENode(op, {"name": literal(self.nodes, n["children"][0], "str")}, [])
        if sig.expr:
            return ENode(op, {}, [], ex=self.cls[n["children"][0]])
        attrs, inputs = {}, []
        for (sort, child), attr in zip(self.args(nid), (*sig.attrs, *([None] * len(n["children"]))), strict=False):
            if sort == "T":
                inputs.append(self.cls[child])
            elif sort == "TList":
                inputs.extend(self.tensor_list(self.cls[child]))
            elif sort == "Epi":
                steps, operands = self.epilogue(self.cls[child])
                attrs[OPS[op].epilogue_attr.name] = tuple(steps)
                inputs.extend(operands)
            else:
                attrs[attr.name] = literal(self.nodes, child, sort)
        return ENode(op, attrs, inputs)


@dataclass
class Problem:
    """``classes[i]`` an e-class id; e-node j is in class ``node_class[j]``, costs
    ``cost[j]`` and needs the classes ``node_children[j]`` (distinct, sorted;
    ``node_args[j]`` lists them in argument order); ``root`` is the outputs' class;
    ``types`` the IR type of each tensor e-class. ``cost`` is in extraction units: the cost
    model's costs times ``scale`` (:func:`cost_scale`) plus the tie-breaking units of
    :func:`build_problem`."""

    classes: list[str]
    class_nodes: list[list[int]]
    node_ids: list[str]
    node_class: np.ndarray
    node_children: list[list[int]]
    node_args: list[list[int]]
    cost: np.ndarray
    root: int
    raw: dict
    types: dict[str, TensorType]
    scale: float = 1.0

    def term(self, choice: dict[int, int]) -> TermDag:
        """The :class:`TermDag` of ``choice`` (class index -> chosen e-node index) from the root;
        its cost is the sum of the chosen e-nodes' costs, each e-class reached counted once, in the
        cost model's units (divided by ``scale``)."""
        nodes = self.raw["nodes"]
        cost = 0.0
        index: dict[int, int] = {}
        out: list[tuple[str, tuple]] = []
        eclasses: list[str] = []
        stack = [(self.root, False)]
        while stack:
            c, ready = stack.pop()
            if c in index:
                continue
            j = choice[c]
            if not ready:
                stack.append((c, True))
                stack.extend((k, False) for k in self.node_children[j] if k not in index)
                continue
            node = nodes[self.node_ids[j]]
            args = []
            kids = iter(self.node_args[j])
            for ch, sort in zip(node["children"], ARG_SORTS[node["op"]], strict=True):
                args.append(index[next(kids)] if sort in CHILD_SORTS else literal(nodes, ch, sort))
            index[c] = len(out)
            out.append((node["op"], tuple(args)))
            eclasses.append(self.classes[c])
            cost += self.cost[j]
        return TermDag(out, index[self.root], cost / self.scale, eclasses, [self.types.get(e) for e in eclasses])


def _ex_type(dec: Decoder, nid: str, types: dict[str, TensorType]) -> TensorType | None:
    """The type of ``Ex`` e-node ``nid`` once its operands' types are known (else None): its
    op's shape rule on them (the value of an ``Ex`` term broadcasts as its ops do)."""
    x = dec.ex_node(nid)
    if x.op == "const":
        return TensorType(tuple(x.attrs["shape"]), DType(x.attrs["dtype"]))
    if x.op == "acc":
        return TensorType(tuple(x.attrs["shape"]))
    if not all(a in types for a in x.args):
        return None
    if x.op == "leaf":
        return types[x.args[0]]
    spec = OPS[x.op]
    try:
        return spec.infer([types[a] for a in x.args], {a.name: a.default for a in spec.attrs} | x.attrs)
    except ShapeError as err:
        raise RewriteError(f"a rule built Ex{x.op} of operands {[str(types[a]) for a in x.args]} that the shape "
                           f"rule of {x.op} rejects: {err}") from None


def _types(dec: Decoder, enc: Encoding, reach: set[str]) -> dict[str, TensorType]:
    """The IR type of every reachable tensor and ``Ex`` e-class: the encoding's type of a
    let-bound node, else (an e-class a rule created) the shape rule of one of its e-nodes
    applied to its inputs' types, which gives the dtype too; an e-class's ``shape`` fact (f32)
    is used where no shape rule can be applied yet."""
    types: dict[str, TensorType] = {}
    for c, d in dec.raw["class_data"].items():
        if d.get("let") in enc.types:
            types[c] = enc.types[d["let"]]
    vectors = {n["eclass"]: n for nid, n in dec.nodes.items() if nid.startswith("primitive-Vec")}
    facts: dict[str, TensorType] = {}
    for n in dec.nodes.values():
        if n["op"] == "shape" and (c := dec.cls[n["children"][0]]) not in types:
            facts[c] = TensorType(tuple(int(dec.nodes[g]["op"]) for g in vectors[n["eclass"]]["children"]))
    pending = [c for c in reach if c not in types and dec.raw["class_data"][c].get("type") in ("T", "Ex")]
    while pending:
        progress = False
        for c in list(pending):
            for nid in dec.members.get(c, []):
                if dec.raw["class_data"][c].get("type") == "Ex" or dec.nodes[nid]["op"] == "Fused":
                    x = dec.cls[dec.nodes[nid]["children"][0]] if dec.nodes[nid]["op"] == "Fused" else None
                    got = types.get(x) if x is not None else _ex_type(dec, nid, types)
                    if got is not None:
                        types[c] = got
                        pending.remove(c)
                        progress = True
                        break
                    continue
                e = dec.enode(nid)
                spec = OPS[e.op]
                if spec.leaf or not all(i in types for i in e.inputs):
                    continue
                full = {a.name: a.default for a in spec.attrs} | _without_regions(e.op, e.attrs)
                try:
                    types[c] = spec.infer([types[i] for i in e.inputs], full)
                except ShapeError as err:
                    raise RewriteError(f"a rule built {e.op} of inputs {[str(types[i]) for i in e.inputs]} that its "
                                       f"shape rule rejects: {err}") from None
                pending.remove(c)
                progress = True
                break
        if not progress:
            known = [c for c in pending if c in facts]
            if not known:
                raise RewriteError(f"the rewrite engine found no type for e-class {pending[0]} "
                                   f"({', '.join(dec.nodes[m]['op'] for m in dec.members.get(pending[0], []))})")
            for c in known:
                types[c] = facts[c]
                pending.remove(c)
    for c, t in facts.items():
        types.setdefault(c, t)
    return types


def build_problem(enc: Encoding, model: CostModel, raw: dict | None = None, *, check_types: bool = True) -> Problem:
    """Read the e-graph of ``enc`` and price every candidate e-node under ``model``.

    ``check_types``: apply the shape rule of every reachable e-node to its inputs' types and
    compare the result (shape and dtype) with its e-class's type, so that an unsound rule (one
    whose sides differ in shape or dtype) is named even when extraction would not pick its
    e-node.

    An e-node's extraction cost is its cost under ``model`` times :func:`cost_scale` of all of
    them, plus tie-breaking units (:data:`FALLBACK_COST`, the unit an ``Ex`` op carries and its
    ``Fused`` e-node takes back): the scale keeps those units small beside the model's costs
    whatever the model's unit, so that multiplying every cost by a constant does not change the
    extracted term (up to ties).

    Raises :class:`RewriteError` when an e-class the outputs need has no type, for an e-node
    whose type differs from its e-class's or whose inputs its shape rule rejects, and for a
    ``kernel_cost`` that raises or returns no finite number >= 0 (:func:`~.cost.checked_cost`).
    """
    raw = egglog_private.serialize(enc.egraph) if raw is None else raw
    dec = Decoder(raw)
    nodes, class_data = raw["nodes"], raw["class_data"]
    root_class = next(c for c, d in class_data.items() if d.get("let") == enc.root)

    def sorted_kids(nid: str) -> list[str]:
        return [dec.cls[ch] for sort, ch in dec.args(nid) if sort in CHILD_SORTS]

    reach, stack = {root_class}, [root_class]
    while stack:
        for nid in dec.members.get(stack.pop(), []):
            for c in sorted_kids(nid):
                if c not in reach:
                    reach.add(c)
                    stack.append(c)
    types = _types(dec, enc, reach)
    classes = sorted(reach)
    cindex = {c: i for i, c in enumerate(classes)}
    node_ids = [nid for c in classes for nid in dec.members.get(c, [])]
    free_params = {c for c in reach for nid in dec.members.get(c, [])
                      if nodes[nid]["op"] == "Parameter" and dec.enode(nid).attrs["name"] not in enc.written}

    priced = np.zeros(len(node_ids))  # the cost model's cost of each e-node
    units = np.zeros(len(node_ids))  # and the tie-breaking units extraction adds to it
    children, ordered = [], []
    inferred = {} if check_types else None
    for j, nid in enumerate(node_ids):
        kids = sorted_kids(nid)
        ordered.append([cindex[c] for c in kids])
        children.append(sorted(set(ordered[-1])))
        priced[j], units[j] = _enode_cost(dec, nid, types, model, free_params, inferred)
    scale = cost_scale(priced)
    cost = np.maximum(priced * scale + units, 0.0)
    class_nodes = [[] for _ in classes]
    node_class = np.array([cindex[dec.cls[nid]] for nid in node_ids], dtype=np.int64)
    left_out = _one_op_regions(dec, node_ids, cost)
    for j, c in enumerate(node_class):
        if j not in left_out:
            class_nodes[c].append(j)
    needs = _necessary(class_nodes, children)
    for c, members in enumerate(class_nodes):
        if len(members) > 1:
            class_nodes[c] = _undominated(members, cost, children, needs)
    return Problem(classes, class_nodes, node_ids, node_class, children, ordered, cost, cindex[root_class], raw, types,
                   scale)


def _without_regions(op: str, attrs: dict) -> dict:
    """``attrs`` with the generated regions (``("ex", e-class)`` steps, :meth:`Decoder.epilogue`)
    left out of an epilogue: the shape rule of the rest gives the node's type, each region being
    checked to give the output's type itself (:func:`_check_type`)."""
    epi = OPS[op].epilogue_attr
    if epi is None or all(isinstance(s, str) for s in attrs[epi.name]):
        return attrs
    return attrs | {epi.name: tuple(s for s in attrs[epi.name] if isinstance(s, str))}


def _check_type(dec: Decoder, nid: str, e: ENode, full: dict, types: dict[str, TensorType],
                inferred: dict[tuple, TensorType]) -> None:
    """Raise :class:`RewriteError` unless e-node ``nid``'s shape rule, applied to its inputs'
    types, gives its e-class's type. ``inferred`` memoises the shape rules' results (the
    layers of a model repeat the same ops on the same types)."""
    c = dec.cls[nid]
    ins = [types[i] for i in e.inputs]
    if (epi := OPS[e.op].epilogue_attr) is not None:  # a region's value is the output's type (f32, its shape)
        for step in e.attrs[epi.name]:
            if isinstance(step, tuple) and types.get(step[1]) != TensorType(types[c].shape):
                raise RewriteError(f"a rule put {e.op} with an epilogue region of type {types.get(step[1])} into "
                                   f"e-class {c} of type {types[c]}: a region must give the output's type")
        full = full | _without_regions(e.op, e.attrs)
    key = (e.op, *ins, *e.attrs.items())
    got = inferred.get(key)
    if got is None:
        try:
            got = inferred[key] = OPS[e.op].infer(ins, full)
        except ShapeError as err:
            raise RewriteError(f"a rule put {e.op} of inputs {[str(t) for t in ins]} into e-class {c} ({types[c]}), "
                               f"but its shape rule rejects those inputs: {err}") from None
    if got != types[c]:
        raise RewriteError(f"a rule put {e.op} of type {got} (inputs {[str(t) for t in ins]}) into e-class {c} of "
                           f"type {types[c]}: a rule whose two sides have different shapes or dtypes is unsound "
                           "(check the rules of the rulesets passed to optimize)")


def _ex_cost(dec: Decoder, nid: str, types: dict[str, TensorType], model: CostModel,
             check: bool) -> tuple[float, float]:
    """An ``Ex`` e-node's cost under ``model`` and its tie-breaking units: a leaf, the bytes of
    reading its tensor; an op, its FLOPs (no dispatch, no bytes: inside a region nothing is
    stored) and one unit. With ``check``, raise :class:`RewriteError` unless its type is its
    e-class's."""
    c = dec.cls[nid]
    x = dec.ex_node(nid)
    if check and (got := _ex_type(dec, nid, types)) != types[c]:
        raise RewriteError(f"a rule put Ex {x.op} of type {got} into Ex e-class {c} of type {types[c]}: a rule whose "
                           "two sides have different shapes or dtypes is unsound (check the rules of the rulesets "
                           "passed to optimize)")
    if x.op == "leaf":
        return checked_cost(model, fused_read_info(types[x.args[0]])), 0.0
    if x.op in ("const", "acc"):
        return 0.0, 0.0
    out = types[c]
    # plus one unit: of two regions that move the same bytes, the one of fewer ops is extracted (a
    # recognised op such as SwiGLU rather than the Silu and Mul it was recognised from); the Fused
    # e-node takes one unit back, so that a region of one op costs what the op's own kernel does
    return checked_cost(model, KernelInfo(f"fused:{x.op}", 0, 0, 0, out.num_elements,
                                          tuple(types[a] for a in x.args), out, x.attrs)), 1.0


#: What extraction adds to the cost of a ``fallback`` op's e-node (OpSpec.fallback): one unit
#: (a byte-equivalent under the default model; see :func:`cost_scale`), so that a specialised op
#: of equal cost is preferred and ties do not fall to the solver's order.
FALLBACK_COST = 1.0

#: The largest cost :func:`cost_scale` leaves a model's costs at (2**40, a terabyte under the
#: default model): beside it a tie-breaking unit still counts in float64 sums and the ILP solver's
#: tolerances.
MAX_SCALED_COST = 2.0 ** 40


def cost_scale(costs: np.ndarray) -> float:
    """The power of two extraction multiplies a cost model's costs by, so that the tie-breaking
    units added to them (one each: :data:`FALLBACK_COST`, the unit of an ``Ex`` op) stay small
    beside the model's costs but still count, whatever the model's unit (seconds, tens of
    megabytes, picobytes), and multiplying every cost by a constant does not change the extracted
    term (up to ties). 1 where the positive costs lie in [1, :data:`MAX_SCALED_COST`] (the default
    model's bytes, the roofline's nanoseconds); where the smallest is below 1, the power that
    brings it into [1, 2) (or the largest to :data:`MAX_SCALED_COST`, if that comes first); where
    the largest is above :data:`MAX_SCALED_COST`, the power that brings it there (or the smallest
    to [1, 2), if that comes first). A power of two changes no cost's significant bits."""
    positive = costs[costs > 0]
    if positive.size == 0:
        return 1.0
    smallest, largest = float(positive.min()), float(positive.max())
    lift = 1 - math.frexp(smallest)[1]  # smallest * 2**lift in [1, 2)
    cap = math.frexp(MAX_SCALED_COST / largest)[1] - 1  # the largest power with largest * 2**cap <= the bound
    if lift > 0:
        return math.ldexp(1.0, max(0, min(lift, cap)))
    return math.ldexp(1.0, min(0, max(lift, cap)))


def _enode_cost(dec: Decoder, nid: str, types: dict[str, TensorType], model: CostModel, free_params: set[str],
                inferred: dict[tuple, TensorType] | None) -> tuple[float, float]:
    """An e-node's cost under ``model`` and the tie-breaking units extraction adds to it (scaled
    costs plus units below 0 count as 0)."""
    name = dec.nodes[nid]["op"]
    if name in ("Epi.bias", "Epi.add"):
        operand = dec.cls[dec.nodes[nid]["children"][1]]
        return checked_cost(model, epilogue_operand_info(name[4:], types[operand])), 0.0
    if name == "ExLeaf" or name == "ExConst" or name in EX_SIGNATURES:
        return _ex_cost(dec, nid, types, model, inferred is not None)
    if name == "Fused":  # one dispatch writing its output; what it reads is charged to its ExLeaf e-nodes
        c, ex = dec.cls[nid], dec.cls[dec.nodes[nid]["children"][0]]
        if inferred is not None and types[ex] != types[c]:
            raise RewriteError(f"a rule put Fused of type {types[ex]} into e-class {c} of type {types[c]}: a rule "
                               "whose two sides have different shapes or dtypes is unsound (check the rules of the "
                               "rulesets passed to optimize)")
        out = types[c]
        # less the unit its first op carries (_ex_cost): a region of one op costs what the op's own kernel does
        return checked_cost(model, KernelInfo("Fused", 1, 0, out.size_bytes, 0, (), out)), -1.0
    if name not in SIGNATURES:
        return 0.0, 0.0  # list cells, Epi.none, Epi.act: structure
    sig = SIGNATURES[name]
    op = sig.op
    spec = OPS[op]
    if spec.leaf or (spec.dispatches == 0 and inferred is None):
        return 0.0, 0.0  # a leaf has no inputs to check
    e = dec.enode(nid)
    full = {a.name: a.default for a in spec.attrs} | e.attrs
    if inferred is not None:
        _check_type(dec, nid, e, full, types, inferred)
    if spec.dispatches == 0:
        return 0.0, 0.0
    if spec.packs_parameters and all(i in free_params for i in e.inputs):
        return 0.0, 0.0  # a derived parameter, packed once when a session is created
    # epilogue operands are charged to their Epi steps: the op reads its fixed inputs
    reads = e.inputs[:sig.tensors] if sig.epilogue else e.inputs
    ins = tuple(types[i] for i in reads)
    cost = checked_cost(model, kernel_info(op, full, ins, types[dec.cls[nid]]))
    return cost, FALLBACK_COST if spec.fallback else 0.0


def _one_op_regions(dec: Decoder, node_ids: list[str], cost: np.ndarray) -> set[int]:
    """The e-nodes ``Op(a, ...)`` of fusable ops left out of extraction: those whose e-class also holds
    ``Fused(ExOp(ExLeaf(a), ...))`` (same attributes), the region of that one op, which
    ``ir.ops.fused.add_fused`` rebuilds as the op's own kernel, and which ``cost`` prices no dearer
    (its ``Fused``, ``ExOp`` and ``ExLeaf`` e-nodes together; under the shipped cost models the two
    cost the same). Two choices for every elementwise op would only slow the ILP down (a third of the
    e-classes of a decoder have one). Where a cost model prices the plain kernel lower (one that
    charges ``Fused`` kernels more), both stay. The ``Fused`` e-node itself always stays: through
    the e-nodes of its ``Ex`` e-classes it is also every larger region of that output."""
    nodes = dec.nodes
    index = {nid: j for j, nid in enumerate(node_ids)}
    leaf_of = {}  # tensor e-class -> its ExLeaf e-node
    fused_of: dict[str, dict[str, str]] = {}  # tensor e-class -> {Ex e-class: its Fused e-node}
    for nid, n in nodes.items():
        if n["op"] == "ExLeaf":
            leaf_of[dec.cls[n["children"][0]]] = nid
        elif n["op"] == "Fused":
            fused_of.setdefault(n["eclass"], {})[dec.cls[n["children"][0]]] = nid

    def key(nid: str, leaf) -> tuple | None:
        n = nodes[nid]
        parts = []
        for sort, ch in zip(ARG_SORTS[n["op"]], n["children"], strict=True):
            if sort in ("T", "Ex"):
                parts.append(leaf(dec.cls[ch]))
                if parts[-1] is None:
                    return None
            else:
                parts.append(nodes[ch]["op"])
        return tuple(parts)

    def leaf_class(c: str) -> str | None:
        return nodes[leaf_of[c]]["eclass"] if c in leaf_of else None

    ex_at: dict[tuple, str] = {}  # (op, literals and operand Ex e-classes) -> its Ex e-node
    for nid, n in nodes.items():
        if n["op"] in EX_SIGNATURES and (k := key(nid, lambda c: c)) is not None:
            ex_at[(EX_SIGNATURES[n["op"]].op, *k)] = nid
    out = set()
    for j, nid in enumerate(node_ids):
        n = nodes[nid]
        sig = SIGNATURES.get(n["op"])
        if sig is None or sig.op not in FUSABLE or n["eclass"] not in fused_of:
            continue
        k = key(nid, leaf_class)
        ex = ex_at.get((sig.op, *k)) if k is not None else None
        fused = fused_of[n["eclass"]].get(nodes[ex]["eclass"]) if ex is not None else None
        if fused is None:
            continue
        leaves = {leaf_of[dec.cls[ch]] for sort, ch in zip(ARG_SORTS[n["op"]], n["children"], strict=True)
                  if sort == "T"}
        parts = [fused, ex, *leaves]
        if any(p not in index for p in parts):
            continue
        if cost[j] >= sum(cost[index[p]] for p in parts):
            out.add(j)
    return out


#: How many levels below an e-node's children :func:`_necessary` follows what they need.
NEED_DEPTH = 3


def _necessary(class_nodes: list[list[int]], children: list[list[int]]) -> list[frozenset[int]]:
    """For each e-class, the classes that any choice of it computes: those every e-node of it has as
    a child, and what those need in turn, :data:`NEED_DEPTH` levels down."""
    direct = [frozenset.intersection(*(frozenset(children[m]) for m in ms)) if ms else frozenset()
              for ms in class_nodes]
    needs = direct
    for _ in range(NEED_DEPTH - 1):
        needs = [d.union(*(direct[k] for k in d)) for d in needs]
    return needs


def _undominated(members: list[int], cost: np.ndarray, children: list[list[int]],
                 needs: list[frozenset[int]] | None = None) -> list[int]:
    """The e-nodes of one e-class that no other e-node of it dominates.

    e-node a is dominated by b when a costs at least as much and every e-class b needs is one a
    needs, directly or as what a child of a needs whichever e-node computes it (``needs``, from
    :func:`_necessary`): then b is at least as good in every extraction, and choosing b where a
    was makes no cycle (what b needs lies below a). ``MatMul(a, b)`` dominates ``FusedMatMul(a, b,
    [])``, for one, and ``AttentionScores(q, k, s c c)`` dominates ``AttentionScores(Mul(q, c),
    Mul(k, c), s)``. Of e-nodes that dominate each other, the first is kept.
    """
    covered = {}
    for a in members:
        have = set(children[a])
        if needs is not None:
            for k in children[a]:
                have |= needs[k]
        covered[a] = have
    keep = []
    for a in members:
        need_a = covered[a]
        dominated = False
        for b in members:
            if b == a or cost[b] > cost[a] or not need_a >= set(children[b]):
                continue
            mutual = cost[b] == cost[a] and covered[b] >= set(children[a])
            if not mutual or b < a:
                dominated = True
                break
        if not dominated:
            keep.append(a)
    return keep


__all__ = ["Decoder", "ENode", "ExNode", "Problem", "build_problem", "cost_scale", "decode", "literal"]
