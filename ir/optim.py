"""One training step as one graph: forward, backward (autodiff) and the optimiser's in-place updates.

:func:`step_graph` differentiates a loss (:func:`~eggfuse.ir.autodiff.grad`) and appends,
for every trainable parameter, the update ops of :mod:`.ops_train` that overwrite the
parameter (and its optimiser state) in place. The outputs are ``[loss, *updated
parameters]``: the updates are outputs only to keep them live; a runtime reads back the
loss alone (``Session.run(read=(0,))``). Optimiser state (velocity, Adam's moments) is a
state tensor (``Graph.state``) the session zero-fills; Adam's step count t >= 1 is a u32[1]
input named :data:`STEP_INPUT` fed by the caller at every step.

Each optimiser is one block below: its spec (hyperparameters, checked) and ``update``,
which appends its ops for one parameter.
"""

from __future__ import annotations

import copy
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .autodiff import TrainingGraph, grad
from .errors import GraphError, InputError
from .graph import Graph, NodeId
from .types import DType

#: Name of Adam's step-count input, u32[1] holding t (1 at the first step).
STEP_INPUT = "optimizer.step"


def _check(name: str, value: float, lo: float, hi: float, lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # float("x") was a raw ValueError
        raise InputError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    value = float(value)
    ok = (lo < value if lo_open else lo <= value) and value < hi
    if not ok:
        lo_bracket = "(" if lo_open else "["
        raise InputError(f"{name} must lie in {lo_bracket}{lo}, {hi}), got {value}")
    return value


@dataclass(frozen=True)
class SGD:
    """Stochastic gradient descent, optionally with momentum (``torch.optim.SGD``, dampening 0,
    no Nesterov): v <- momentum v + g, then p <- p - lr (v + weight_decay p).

    With ``momentum=0`` (no velocity state) this is p <- p - lr (g + weight_decay p), as torch.
    With momentum, weight decay acts on the parameter directly (``SgdUpdate``) where torch
    folds it into the velocity. State per parameter: ``<name>.momentum`` of its shape.
    Raises InputError for lr <= 0, momentum outside [0, 1) or a negative weight decay.
    """

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    uses_step = False

    def __post_init__(self) -> None:
        _check("SGD lr", self.lr, 0.0, float("inf"), lo_open=True)
        _check("SGD momentum", self.momentum, 0.0, 1.0)
        _check("SGD weight_decay", self.weight_decay, 0.0, float("inf"))

    def update(self, g: Graph, name: str, param: NodeId, gradient: NodeId, step: NodeId | None) -> NodeId:
        """Append the update of ``param`` (named ``name``) by ``gradient``; returns the updated value."""
        direction = gradient
        if self.momentum:
            velocity = g.state(f"{name}.momentum", g.node(param).type.shape)
            direction = g.add_node("SgdMomentum", (velocity, gradient, param), momentum=self.momentum)
        return g.add_node("SgdUpdate", (param, direction), lr=self.lr, weight_decay=self.weight_decay)


@dataclass(frozen=True)
class Adam:
    """Adam (Kingma & Ba 2015, Algorithm 1, bias-corrected); with ``weight_decay`` > 0, AdamW's
    decoupled decay (Loshchilov & Hutter 2019): p <- p - lr (m_hat / (sqrt(v_hat) + eps) + wd p).

    State per parameter: ``<name>.adam`` [2, *shape] (first and second moments). Needs the
    step count t as the u32[1] input :data:`STEP_INPUT`. Raises InputError for lr <= 0,
    betas outside [0, 1), eps <= 0 or a negative weight decay.
    """

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    uses_step = True

    def __post_init__(self) -> None:
        _check("Adam lr", self.lr, 0.0, float("inf"), lo_open=True)
        if isinstance(self.betas, str | bytes) or not hasattr(self.betas, "__len__") or len(self.betas) != 2:
            raise InputError(f"Adam betas must be a pair (beta1, beta2), got {self.betas!r}; e.g. betas=(0.9, 0.999)")
        for i, b in enumerate(self.betas):
            _check(f"Adam beta{i + 1}", b, 0.0, 1.0)
        _check("Adam eps", self.eps, 0.0, float("inf"), lo_open=True)
        _check("Adam weight_decay", self.weight_decay, 0.0, float("inf"))

    def update(self, g: Graph, name: str, param: NodeId, gradient: NodeId, step: NodeId | None) -> NodeId:
        """Append the update of ``param`` (named ``name``) by ``gradient``; returns the updated value."""
        b1, b2 = (float(b) for b in self.betas)
        moments = g.state(f"{name}.adam", (2, *g.node(param).type.shape))
        moments = g.add_node("AdamMoments", (moments, gradient), beta1=b1, beta2=b2)
        return g.add_node("AdamStep", (param, moments, step), lr=self.lr, beta1=b1, beta2=b2, eps=self.eps,
                          weight_decay=self.weight_decay)


Optimizer = SGD | Adam


class StepGraph(Graph):
    """The graph of one training step: outputs ``[loss, *updated parameters]``.

    ``updates`` maps each trained parameter to its output index (1, 2, ...), ``state_shapes`` maps
    each optimiser state tensor to its shape, ``step_input`` is :data:`STEP_INPUT` when the
    optimiser needs the step count (else None), ``frozen`` names the parameters left as they
    are (frozen, or not reached by the loss: their gradient is zero).
    """

    loss_output = 0

    def __init__(self) -> None:
        super().__init__()
        self.updates: dict[str, int] = {}
        self.state_shapes: dict[str, tuple[int, ...]] = {}
        self.step_input: str | None = None
        self.frozen: tuple[str, ...] = ()


def step_graph(graph: Graph, loss: NodeId | None, optimizer: Optimizer, *, wrt: Sequence[str] | None = None,
               frozen: Iterable[str] = ()) -> StepGraph:
    """Forward + backward + in-place updates of ``graph`` as one :class:`StepGraph`.

    ``loss`` is an f32[1] (or f32[]) node of ``graph``, differentiated with respect to ``wrt`` (default:
    every parameter not in ``frozen``; see :func:`~eggfuse.ir.autodiff.grad`). With
    ``loss=None``, ``graph`` must already be a :class:`TrainingGraph` (outputs ``[loss,
    *grads]``). A parameter whose gradient is zero (the loss does not reach it) is not
    updated. ``graph`` is not modified.

    Raises GraphError for what ``grad`` refuses, a ``wrt`` name that is an Input rather
    than a Parameter, a loss that depends on none of the parameters trained (nothing to update), a graph
    that already has a leaf with an optimiser state's name or
    :data:`STEP_INPUT`, or ``loss=None`` with a graph that is not a TrainingGraph.
    """
    if loss is None:
        if not isinstance(graph, TrainingGraph):
            raise GraphError("step_graph: loss=None needs a TrainingGraph (from autodiff.grad), "
                             f"got a {type(graph).__name__}")
        tg = graph
    else:
        tg = grad(graph, loss, wrt, frozen)
    g = StepGraph()
    for attr, value in vars(tg).items():  # nodes, leaf names: copied, so tg is untouched
        if attr not in ("grad_outputs", "zero_grads"):
            setattr(g, attr, copy.copy(value))
    params = tg.parameters
    for name in tg.grad_outputs:
        if name not in params:
            raise GraphError(f"step_graph: {name!r} is an Input; only Parameters can be trained")
    if tg.grad_outputs and set(tg.grad_outputs) <= set(tg.zero_grads):  # a step that would change nothing
        loss_node = tg.node(tg.outputs[tg.loss_output])
        raise GraphError(f"step_graph: the loss ({loss_node.describe()}) depends on none of the parameters it is "
                         f"trained with respect to ({', '.join(map(repr, tg.grad_outputs))}): no step would change "
                         "them; build the loss from the model's outputs")
    step = g.input(STEP_INPUT, [1], DType.U32) if optimizer.uses_step else None
    g.step_input = STEP_INPUT if optimizer.uses_step else None
    outs = [tg.outputs[tg.loss_output]]
    for name, index in tg.grad_outputs.items():
        if name in tg.zero_grads:
            continue
        param = g._leaf_names[name]
        before = len(g.nodes)
        outs.append(optimizer.update(g, name, param, tg.outputs[index], step))
        g.updates[name] = len(outs) - 1
        for n in g.nodes[before:]:
            if n.op == "Parameter":
                g.state_shapes[n.attrs["name"]] = n.type.shape
    g.frozen = tuple(name for name in params if name not in g.updates and not _is_state(tg, name))
    g.set_outputs(outs)
    return g


def _is_state(graph: Graph, name: str) -> bool:
    """Whether parameter ``name`` of ``graph`` is a state tensor (``Graph.state``)."""
    return bool(graph.node(graph._leaf_names[name]).attrs.get("state"))
