"""The pipeline, in one place: optimise (``rewrites``) -> lower (``lowering``) -> bind (a
``runtime.Session``). The facade's ``compile``, ``embed``, ``generate`` and ``Trainer`` all go
through :func:`compile`; each step is timed and can be called on its own."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from eggfuse.ir import Graph, InputError
from eggfuse.ir.reference import check_mapping
from eggfuse.lowering import ExecutionPlan, lower

if TYPE_CHECKING:
    from collections.abc import Sequence

    from egglog import Ruleset

    from eggfuse.rewrites import CostModel, Report
    from eggfuse.runtime import Session


@dataclass
class Compiled:
    """A graph compiled for a device: run it with :meth:`run`.

    ``graph`` is the graph that runs (the optimised one unless ``fuse=False``), ``plan`` its
    :class:`~eggfuse.lowering.ExecutionPlan`, ``session`` the bound
    :class:`~eggfuse.runtime.Session`, ``report`` the rewrite engine's
    :class:`~eggfuse.rewrites.Report` (None when not fused). ``dispatches_unfused`` /
    ``dispatches_fused`` count GPU dispatches per run of the original and the compiled graph.
    ``timings`` holds seconds per step: ``optimize_s`` (when fused), ``lower_s``, ``bind_s``
    (buffers, uploads, pipelines) and ``compile_s`` (lower + bind).
    """

    graph: Graph
    plan: ExecutionPlan
    session: Session
    report: Report | None
    dispatches_unfused: int
    dispatches_fused: int
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def adapter(self) -> str:
        return self.session.adapter

    def run(self, inputs: Mapping[str, np.ndarray], **kw: Any) -> list[np.ndarray]:
        """Outputs (float32 / uint32 numpy arrays, in graph output order) for ``inputs``
        (``Session.run``'s keywords pass through)."""
        return self.session.run(inputs, **kw)


def optimize(graph: Graph, *, cost_model: CostModel | None = None, rulesets: Sequence[Ruleset] | None = None,
             verify: bool = False) -> tuple[Graph, Report]:
    """The rewrite engine's step (``eggfuse.rewrites.optimize``, whose arguments these are;
    egglog loads on first use). ``rulesets`` None runs the shipped optimisation rulesets."""
    from eggfuse.rewrites import optimize as rewrite

    return rewrite(graph, cost_model=cost_model, rulesets=rulesets, verify=verify)


def lower_for(graph: Graph, device=None, *, subgroups: bool | None = None) -> ExecutionPlan:
    """Lower ``graph`` against ``device``'s limits (default: the process-wide device).

    ``subgroups``: lower reductions with subgroup operations; None (default) when the device
    has usable ones (``runtime.device.subgroup_reductions_usable``). Raises InputError for
    ``subgroups`` not None/True/False or True on a device without them, LoweringError when
    the graph exceeds the device's limits, DeviceError when there is no device.
    """
    from eggfuse.runtime.device import get_device, subgroup_reductions_usable

    if subgroups is not None and not isinstance(subgroups, bool):
        raise InputError(f"subgroups must be None, True or False, got {subgroups!r}")
    device = device if device is not None else get_device()
    usable = subgroups is not False and subgroup_reductions_usable(device)
    if subgroups and not usable:
        raise InputError("subgroups=True, but this device has no usable subgroup operations "
                         "(runtime.device.subgroup_reductions_usable)")
    return lower(graph, dict(device.limits), subgroups=usable)


def compile(graph: Graph, params: Mapping[str, np.ndarray], *, fuse: bool = True,
            cost_model: CostModel | None = None, rulesets: Sequence[Ruleset] | None = None, verify: bool = False,
            device=None, share: Session | None = None, subgroups: bool | None = None,
            prerecord: bool = True, finite_inputs: bool = True) -> Compiled:
    """Optimise ``graph`` with the egglog rulesets (``fuse=True``), lower it for ``device`` and
    bind it: parameters uploaded once, pipelines and bind groups built.

    ``cost_model``, ``rulesets`` and ``verify`` go to :func:`optimize`: ``rulesets`` None runs
    the shipped ones, ``[*optimization_rulesets(), mine]`` adds a ruleset of one's own
    (``eggfuse.rewrites.make_ruleset``).

    ``share`` binds to another session's buffers of the same names (weights, KV caches: see
    ``Session``); ``subgroups`` as :func:`lower_for`; ``prerecord`` and ``finite_inputs`` (False:
    float inputs may hold NaN and infinities) as ``Session``.

    The accepted inputs and parameters are those of ``graph`` as built, fused or not (the
    optimised graph keeps the leaves no output reads, and a session ignores their values).

    Raises :class:`~eggfuse.ir.GraphError` for a graph without outputs,
    :class:`~eggfuse.ir.InputError` for ``params`` that is not a mapping and for missing,
    unknown or mis-shaped parameters,
    :class:`~eggfuse.ir.RewriteError` if ``verify=True`` finds the optimised graph differs,
    :class:`~eggfuse.ir.LoweringError` when the device's limits are exceeded and
    :class:`~eggfuse.ir.DeviceError` when no wgpu adapter exists. ``graph`` and ``params``
    are not modified.
    """
    from eggfuse.runtime import Session  # wgpu is only imported when something runs

    graph.check_outputs()  # both checked before the (slower) optimisation
    check_mapping("parameter", params, graph.parameters)
    timings: dict[str, float] = {}
    report = None
    run_graph = graph
    if fuse:
        t = time.perf_counter()
        run_graph, report = optimize(graph, cost_model=cost_model, rulesets=rulesets, verify=verify)
        timings["optimize_s"] = time.perf_counter() - t
    t = time.perf_counter()
    if device is None and share is not None:
        device = share.device
    plan = lower_for(run_graph, device, subgroups=subgroups)
    timings["lower_s"] = time.perf_counter() - t
    t = time.perf_counter()
    session = Session(plan, params, device=device, share=share, prerecord=prerecord, finite_inputs=finite_inputs)
    timings["bind_s"] = time.perf_counter() - t
    timings["compile_s"] = timings["lower_s"] + timings["bind_s"]
    return Compiled(run_graph, plan, session, report, graph.dispatch_count(), run_graph.dispatch_count(), timings)


__all__ = ["Compiled", "compile", "lower_for", "optimize"]
