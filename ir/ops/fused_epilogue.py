"""Generated epilogues: a region of broadcasting elementwise ops computed at a matmul's or a
convolution's store, as one step of its epilogue chain.

An epilogue step ``("expr", steps)`` holds a region in the form of a ``Fused`` node's ``expr``
(``ir/ops/fused.py``): input 0 is the accumulator (the value of the chain so far, f32, of the
output's shape) and inputs 1..n are the step's n operands, taken from the node's epilogue
operands in chain order like the operands of ``bias`` and ``add``. Each operand is read with
numpy broadcasting to the output's shape; the region's value must be f32 of the output's
shape (it is what the next step, or the store, receives). So ``s2 * HardSwish(s1 * conv + b1)
+ b2`` is one step of a FusedConv, and ``Mul(Silu(x @ Wg), u)`` one of a FusedMatMul.

The kernels compute the step as ``Fused`` kernels do, with the same WGSL expressions
(``FUSABLE[op].wgsl``): one ``let`` per step after the operands' loads (:func:`expr_lines`).
In the e-graph the step is ``Epi.ex(e, x)``, ``x`` an ``Ex`` term over ``ExAcc(shape)`` (the
accumulator) and ``ExLeaf`` operands (``rewrites/sorts.py``); the rules that build it are
``ir/ops/epilogue_rules.py``.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import GraphError
from ..spec import need
from ..types import TensorType
from .broadcasting import merge_broadcast
from .fused import FUSABLE, _reference, full_attrs, ops_of, step_types, wgsl_literal

#: The tag of a generated epilogue step.
EXPR = "expr"


def is_expr(step) -> bool:
    """Whether epilogue step ``step`` is a generated region ``("expr", steps)``."""
    return isinstance(step, tuple) and len(step) == 2 and step[0] == EXPR


def expr_operands(step) -> int:
    """How many epilogue operands the region ``step`` reads (its inputs less the accumulator)."""
    return sum(1 for s in step[1] if s[0] == "input") - 1


def epilogue_ops(epilogue) -> int:
    """The elementwise ops of a chain, for its FLOPs: one per step, a region's ops for a region."""
    return sum(len(ops_of(s[1])) if is_expr(s) else 1 for s in epilogue)


def step_label(step) -> str:
    """A step's name in kernel names and reports: ``bias``, ``Relu``, ``expr(Mul,HardSwish)``."""
    return f"{EXPR}({','.join(ops_of(step[1]))})" if is_expr(step) else step


def check_expr(step, out: TensorType, operands: list[TensorType]) -> None:
    """ShapeError unless region ``step`` on the accumulator (f32 of ``out``'s shape) and
    ``operands`` gives f32 of ``out``'s shape."""
    need(isinstance(step[1], tuple) and len(step[1]) > 0, f"an {EXPR} step holds a non-empty tuple of steps")
    acc = TensorType(out.shape)
    got = step_types(step[1], [acc, *operands])[-1]
    need(got == acc, f"an {EXPR} step must give {acc} (the output), got {got} from operands "
                     f"{[str(t) for t in operands]}")


def apply_expr(step, v: np.ndarray, operands) -> np.ndarray:
    """The reference value of region ``step`` on accumulator ``v`` and ``operands``."""
    return _reference([v, *operands], {"expr": step[1]})


def _index(out_shape, shape) -> str:
    """The WGSL index into an operand of ``shape`` broadcast to ``out_shape`` at output index ``{at}``."""
    dims, (st,) = merge_broadcast(out_shape, [shape])
    if not any(st):
        return "0u"
    if st == [math.prod(dims[d + 1:]) for d in range(len(dims))]:
        return "{at}"
    terms = []
    for d, (size, stride) in enumerate(zip(dims, st, strict=True)):
        if stride == 0:
            continue
        inner = math.prod(dims[d + 1:])
        coord = "({at})" if inner == 1 else f"(({{at}}) / {inner}u)"
        if d > 0:
            coord = f"({coord} % {size}u)"
        terms.append(coord if stride == 1 else f"{coord} * {stride}u")
    return " + ".join(terms)


def expr_lines(step, tag: int, out_shape, operands: list[TensorType], first: int) -> list[str]:
    """The WGSL lines of region ``step`` at a store: ``v`` (f32) is the accumulator and becomes
    the region's value; operand k binds as ``e<first + k>`` and is read at its broadcast index
    of output index ``{at}`` (lines are ``str.format`` templates: ``{at}`` to fill, other braces
    doubled). ``tag`` keeps the variables of two regions of one chain apart."""
    steps = step[1]
    types = step_types(steps, [TensorType(tuple(out_shape)), *operands])
    lines = []
    for k, (name, attrs, args) in enumerate(steps):
        var = f"r{tag}_{k}"
        if name == "input":
            i = args[0]
            load = "v" if i == 0 else f"e{first + i - 1}[{_index(out_shape, operands[i - 1].shape)}]"
            lines.append(f"    let {var} = {load};")
            continue
        if name == "const":
            expr = wgsl_literal(dict(attrs)["value"], types[k].dtype)
        else:
            sig = tuple(types[a].dtype for a in args)
            expr = FUSABLE[name].wgsl(sig, full_attrs(name, attrs), [f"r{tag}_{a}" for a in args])
        expr = expr.replace("{", "{{").replace("}", "}}")
        lines.append(f"    let {var}: {types[k].dtype.wgsl} = {expr};")
    lines.append(f"    v = r{tag}_{len(steps) - 1};  // {step_label(step)}")
    return lines


def no_expr_grad(epilogue, op: str) -> None:
    """GraphError when ``epilogue`` holds a generated region: such chains are made by the rewrite
    engine after differentiation."""
    if any(is_expr(s) for s in epilogue):
        raise GraphError(f"{op}: an epilogue with a generated region ({', '.join(map(step_label, epilogue))}) has "
                         "no gradient rule; it is made by the rewrite engine from ops that autodiff differentiated "
                         "already: differentiate the graph before optimising it")


def compose(first, n_first: int, second) -> tuple:
    """One region step computing region ``second`` on the value of region ``first`` (which reads
    ``n_first`` operands): the operands of ``first``, then those of ``second``."""
    steps = list(first[1])
    last = len(steps) - 1
    index = {}
    for k, (name, attrs, args) in enumerate(second[1]):
        if name == "input" and args[0] == 0:
            index[k] = last
            continue
        if name == "input":
            steps.append(("input", (), (n_first + args[0],)))
        else:
            steps.append((name, attrs, tuple(index[a] for a in args)))
        index[k] = len(steps) - 1
    return EXPR, tuple(steps)


def _renumber(steps, alive: list[int], first: dict[int, int]) -> tuple[tuple, list[int]]:
    """Steps ``alive`` of a region as a region of their own: step j of ``first`` becomes input
    ``first[j]`` (0 or its accumulator), other input steps new inputs 1, 2, ...; and the original
    input index of each new input 1, 2, ..."""
    index, out, reads = {}, [], []
    for j in alive:
        name, attrs, args = steps[j]
        if j in first:
            out.append(("input", (), (first[j],)))
        elif name == "input":
            reads.append(args[0])
            out.append(("input", (), (len(reads),)))
        else:
            out.append((name, attrs, tuple(index[a] for a in args)))
        index[j] = len(out) - 1
    return tuple(out), reads


def _reached(steps, root: int, stop: int | None = None) -> set[int]:
    seen, stack = set(), [root]
    while stack:
        k = stack.pop()
        if k not in seen:
            seen.add(k)
            if k != stop and steps[k][0] not in ("input", "const"):
                stack.extend(steps[k][2])
    return seen


def split(step, room: int) -> tuple[tuple, list[int], tuple, list[int]] | None:
    """Region ``step`` cut in two where a part of it that reads the accumulator and at most
    ``room`` operands gives the only value the rest needs of it: (head, its operand indices,
    tail, its operand indices), the indices 1-based as the region's inputs, the tail reading the
    head's value as its accumulator; the cut whose head holds the most steps, or None."""
    steps = step[1]
    last, best = len(steps) - 1, None
    for k in range(last):
        if steps[k][0] in ("input", "const"):
            continue
        part = _reached(steps, k)
        rest = _reached(steps, last, stop=k)
        # the rest may read again an operand or a literal of the part, nothing else of it
        shared = {j for j in part - {k}
                  if not (steps[j][0] == "const" or (steps[j][0] == "input" and steps[j][2] != (0,)))}
        reads = {steps[j][2][0] for j in part if steps[j][0] == "input"}
        if k not in rest or 0 not in reads or len(reads) - 1 > room or rest & shared:
            continue
        if best is None or len(part) > len(best[1]):
            best = (k, part, rest)
    if best is None:
        return None
    k, part, rest = best
    acc = [j for j in part if steps[j][0] == "input" and steps[j][2] == (0,)]
    head, head_reads = _renumber(steps, sorted(part), dict.fromkeys(acc, 0))
    tail, tail_reads = _renumber(steps, sorted(rest), {k: 0})
    return (EXPR, head), head_reads, (EXPR, tail), tail_reads


def fold_constants(g, steps, operands: list[int]) -> tuple[tuple, list[int]]:
    """Region ``steps`` (input 0 the accumulator) with every one-element Constant operand of
    graph ``g`` baked in as a literal, and the operands still read."""
    out, keep = [], []
    for name, attrs, args in steps:
        if name != "input" or args[0] == 0:
            out.append((name, attrs, args))
            continue
        node = g.node(operands[args[0] - 1])
        if node.op == "Constant" and node.type.num_elements == 1:
            value = np.asarray(node.attrs["value"]).reshape(-1)[0].item()
            out.append(("const", (("dtype", node.type.dtype.value), ("shape", node.type.shape), ("value", value)), ()))
        else:
            keep.append(operands[args[0] - 1])
            out.append(("input", (), (len(keep),)))
    return tuple(out), keep


__all__ = ["EXPR", "apply_expr", "check_expr", "compose", "epilogue_ops", "expr_lines", "expr_operands",
           "fold_constants", "is_expr", "no_expr_grad", "split", "step_label"]
