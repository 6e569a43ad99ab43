"""Losses and their gradients: CrossEntropyLoss and BceLoss, each [1], with the gradient op
autodiff emits for its prediction (neither has a gradient with respect to its labels).

Knowingly slow at scale, as their WGSL headers say: both losses reduce in one workgroup
(WGSL has no float atomics).
"""

from __future__ import annotations

import numpy as np

from ..errors import GraphError
from ..kernel import REDUCTION_ITERATIONS, Kernel, elementwise_groups
from ..spec import NO_GRAD, need, need_f32, op
from ..types import TensorType
from .norms import log_softmax, softmax_ref

FAMILY = "losses"


def _no_label_grad(b, node, want) -> None:
    if want[1]:
        raise GraphError(f"grad: the labels of {node.describe()} depend on a differentiated leaf; {node.op} has no "
                         "gradient with respect to its labels")


# --- CrossEntropyLoss ----------------------------------------------------------------------------


def _cross_entropy(ts, a):
    logits, labels = ts
    need_f32(logits, "logits")
    need(logits.rank == 2, f"logits must be [M, V], got {logits}")
    need(labels == logits, f"labels {labels} must have the type of logits {logits} (one-hot f32)")
    return TensorType((1,))


def _cross_entropy_grad(ts, a):
    _cross_entropy(ts, a)
    return ts[0]


def _cross_entropy_grad_ref(xs, a):
    logits, labels = xs
    p = softmax_ref([logits], a)
    return (p * labels.sum(axis=-1, keepdims=True) - labels) / logits.shape[0]


def cross_entropy_iterations(rows: int, n: int) -> tuple[int, int]:
    """Loop iterations an invocation runs, as ``Kernel.loop_iterations`` counts them, of CrossEntropyLoss's two
    kernels for logits [rows, n]: (cross_entropy.wgsl: every row by the whole workgroup, four reductions each;
    cross_entropy_rows.wgsl: rows split among the 256 invocations, one reduction at the end)."""
    by_workgroup = rows * (1 + 2 * -(-n // 256) + 4 * REDUCTION_ITERATIONS)
    by_invocation = -(-rows // 256) * (1 + 2 * n) + REDUCTION_ITERATIONS
    return by_workgroup, by_invocation


def _cross_entropy_kernel(node, ins, target) -> Kernel:
    rows, n = ins[0].shape
    params = (("rows", "u32", rows), ("n", "u32", n), ("inv_rows", "f32", 1.0 / rows))
    if node.op == "CrossEntropyLoss":  # the kernel of fewer iterations an invocation (few long rows or many short)
        by_workgroup, by_invocation = cross_entropy_iterations(rows, n)
        if by_invocation < by_workgroup:
            return Kernel("cross_entropy_rows", "cross_entropy_rows.wgsl", 1, params=params,
                          loop_iterations=by_invocation)
        return Kernel("cross_entropy", "cross_entropy.wgsl", 1, params=params, loop_iterations=by_workgroup)
    return Kernel("cross_entropy_grad", "cross_entropy_grad.wgsl", rows, params=params)


def _cross_entropy_vjp(b, node, dy, want):
    from ..autodiff import ONE

    _no_label_grad(b, node, want)
    d = b.emit("CrossEntropyLossGrad", node.inputs)
    return [d if dy == ONE else b.emit("Mul", (d, dy)), None]


op("CrossEntropyLoss", ("logits", "labels"), _cross_entropy,
   lambda xs, a: np.array([-(xs[1] * log_softmax(xs[0])).sum() / xs[0].shape[0]]),
   vjp=_cross_entropy_vjp, vjp_takes_one=True, kernel=_cross_entropy_kernel,
   flops=lambda ins, out, a: 5 * ins[0].num_elements,
   doc="loss[1] = -(1/M) sum_i sum_j labels[i,j] * log_softmax(logits)[i,j]; logits and labels [M, V] (labels "
       "one-hot or a distribution per row; an all-zero row adds nothing). log_softmax is max-subtracted (seed: "
       "CrossEntropyLoss)")
op("CrossEntropyLossGrad", ("logits", "labels"), _cross_entropy_grad, _cross_entropy_grad_ref, vjp=NO_GRAD,
   kernel=_cross_entropy_kernel, flops=lambda ins, out, a: 5 * ins[0].num_elements,
   doc="d loss / d logits [M,V] = (softmax(logits) * rowsum(labels) - labels) / M; equals (softmax - labels) / M "
       "for one-hot rows and is 0 on an all-zero label row. Inputs [logits, labels]; a loss seed other than 1 is "
       "applied by a Mul after it")


# --- BceLoss -------------------------------------------------------------------------------------

#: Lower clamp of each log in BceLoss, as torch.nn.BCELoss (keeps the loss finite at p = 0, 1).
BCE_LOG_MIN = -100.0


def _bce(ts, a):
    pred, labels = ts
    need_f32(pred, "pred")
    need(labels == pred, f"labels {labels} must have the type of pred {pred}")
    return TensorType((1,))


def _bce_grad(ts, a):
    _bce(ts, a)
    return ts[0]


def _clamped_log(u):
    with np.errstate(divide="ignore", invalid="ignore"):
        lu = np.log(u)
    return np.maximum(lu, BCE_LOG_MIN), lu > BCE_LOG_MIN


def _bce_ref(xs, a):
    p, t = xs
    lp, _ = _clamped_log(p)
    lq, _ = _clamped_log(1.0 - p)
    return np.array([-(t * lp + (1.0 - t) * lq).sum() / p.size])


def _bce_grad_ref(xs, a):
    p, t = xs
    _, in_p = _clamped_log(p)
    _, in_q = _clamped_log(1.0 - p)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(in_p, t / p, 0.0) - np.where(in_q, (1.0 - t) / (1.0 - p), 0.0)
    return -d / p.size


def _bce_kernel(node, ins, target) -> Kernel:
    n = ins[0].num_elements
    params = (("n", "u32", n), ("inv_n", "f32", 1.0 / n))
    if node.op == "BceLoss":
        return Kernel("bce_loss", "bce_loss.wgsl", 1, params=params, entry_point="loss")
    return Kernel("bce_loss_grad", "bce_loss.wgsl", elementwise_groups(n), params=params, entry_point="grad")


def _bce_vjp(b, node, dy, want):
    from ..autodiff import ONE

    _no_label_grad(b, node, want)
    d = b.emit("BceLossGrad", node.inputs)
    return [d if dy == ONE else b.emit("Mul", (d, dy)), None]


op("BceLoss", ("pred", "labels"), _bce, _bce_ref, vjp=_bce_vjp, vjp_takes_one=True, kernel=_bce_kernel,
   flops=lambda ins, out, a: 6 * ins[0].num_elements,
   doc="loss[1] = -(1/n) sum t log(p) + (1 - t) log(1 - p) over all n elements, each log clamped below at -100 "
       "as torch.nn.BCELoss (so p = 0 or 1 gives a finite loss); pred p in [0, 1], labels t of pred's type (0/1 or "
       "soft). Outside [0, 1] the reference is NaN (seed: BceLoss; the clamp from the torch.nn.BCELoss "
       "documentation)")
op("BceLossGrad", ("pred", "labels"), _bce_grad, _bce_grad_ref, vjp=NO_GRAD, kernel=_bce_kernel,
   flops=lambda ins, out, a: 6 * ins[0].num_elements,
   doc="d loss / d p = -(1/n) (t/p [log p > -100] - (1-t)/(1-p) [log(1-p) > -100]): the derivative of the "
       "clamped loss, 0 where a log is clamped (at p = 0 or 1). Inputs [pred, labels]; a loss seed other than 1 is "
       "applied by a Mul after it")
