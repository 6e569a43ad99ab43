"""The pipeline, in one place: optimise (``rewrites``) -> lower (``lowering``) -> bind (a
``runtime.Session``). The facade's ``compile``, ``embed``, ``generate`` and ``Trainer`` all go
through :func:`compile`; each step is timed and can be called on its own."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from eggfuse.ir import Graph, InputError, LoweringError, require_graph
from eggfuse.ir.reference import check_mapping
from eggfuse.lowering import ExecutionPlan, lower

if TYPE_CHECKING:
    from collections.abc import Sequence

    from egglog import Ruleset

    from eggfuse.rewrites import CostModel, Report
    from eggfuse.runtime import Session


@dataclass(repr=False)
class Compiled:
    """A graph compiled for a device: run it with :meth:`run`.

    ``graph`` is the graph that runs (the optimised one, or with ``fuse=False`` a copy of the one given), ``plan`` its
    :class:`~eggfuse.lowering.ExecutionPlan`, ``session`` the bound
    :class:`~eggfuse.runtime.Session`, ``report`` the rewrite engine's
    :class:`~eggfuse.rewrites.Report` (None when not fused). ``dispatches_unfused`` /
    ``dispatches_fused`` count the ops that dispatch (``Graph.dispatch_count``, what the cost
    model counts) of the original and the compiled graph; ``plan_dispatches`` the plan's GPU
    dispatches per run, which lowering may add to: the reduction of a split-K product with the RmsNorm
    prologue or too many bindings for one kernel (``ir/ops/matmul_kernel.py`` ``matmul_splits``,
    ``last_split``), the LayerNorm before a GEMV, an embedding LayerNorm split where the device binds
    few buffers.
    ``timings`` holds seconds per step: ``device_s`` (getting the device and probing its
    subgroup operations, where this compile did it), ``optimize_s`` (when fused), ``lower_s``,
    ``bind_s`` (buffers, uploads, pipelines), ``compile_s`` (lower + bind) and, when an entry
    was written, ``cache_write_s``. ``cache`` says whether the compile cache (``eggfuse.cache``)
    had the result: ``hit``, ``miss`` (computed, and stored) or ``off`` (not asked for, or its folder could not
    be written: a warning says why); ``cache_loaded`` names the steps whose
    results it loaded (``optimize``, ``lower``), whose timings are then the time spent loading.
    """

    graph: Graph
    plan: ExecutionPlan
    session: Session
    report: Report | None
    dispatches_unfused: int
    dispatches_fused: int
    timings: dict[str, float] = field(default_factory=dict)
    cache: str = "off"
    cache_loaded: tuple[str, ...] = ()

    @property
    def adapter(self) -> str:
        return self.session.adapter

    def __repr__(self) -> str:
        # a line: the plan's WGSL and the graph's nodes are in plan.summary() and graph
        timings = ", ".join(f"{k} {v:.3f}" for k, v in self.timings.items())
        return (f"Compiled({self.adapter}: {self.dispatches_unfused} -> {self.dispatches_fused} dispatching ops, "
                f"{self.plan_dispatches} dispatches per run, cache {self.cache}; {timings})")

    @property
    def plan_dispatches(self) -> int:
        return len(self.plan.dispatches)

    @property
    def f16_weights(self) -> list[str]:
        """The parameters the plan stores as float16 (``precision="f16"``), sorted."""
        return sorted({name for d in self.plan.derived.values() if d.store == "f16" for name in d.sources})

    def run(self, inputs: Mapping[str, np.ndarray], read: Sequence[int] | None = None) -> list[np.ndarray]:
        """Outputs (numpy arrays in graph output order, each of its output's dtype: float32 for f32, uint32 for
        u32, int32 for i32, bool for bool: ``self.plan.output_types``) for ``inputs``: as
        :meth:`Session.run <eggfuse.runtime.Session.run>`, whose ``read`` (the output indices to copy back;
        None: all) and errors these are."""
        return self.session.run(inputs, read)


def optimize(graph: Graph, *, cost_model: CostModel | None = None, rulesets: Sequence[Ruleset] | None = None,
             verify: bool = False) -> tuple[Graph, Report]:
    """The rewrite engine's step (``eggfuse.rewrites.optimize``, whose arguments these are;
    egglog loads on first use). ``rulesets`` None runs the shipped optimisation rulesets."""
    from eggfuse.rewrites import optimize as rewrite

    return rewrite(graph, cost_model=cost_model, rulesets=rulesets, verify=verify)


def lower_for(graph: Graph, device=None, *, subgroups: bool | None = None,
              prefetch: bool | None = None, runtime_checks: bool | None = None,
              constant_params: bool | None = None, transpose_weights: bool | None = None) -> ExecutionPlan:
    """Lower ``graph`` against ``device``'s limits (default: the process-wide device).

    ``subgroups``: lower reductions with subgroup operations; None (default) when the device
    has usable ones (``runtime.device.subgroup_reductions_usable``). ``prefetch``: as
    :func:`eggfuse.lowering.lower`'s (narrow attention dispatches read the next dispatches'
    weights into the L2 cache); None (default) on every adapter but a CPU one. ``runtime_checks``: as
    :func:`eggfuse.lowering.lower`'s; None (default): :func:`runtime_checks_for` (False, kernels
    without naga's runtime checks, unless EGGFUSE_RUNTIME_CHECKS=1). ``constant_params``: as
    :func:`eggfuse.lowering.lower`'s (kernels read their parameters as WGSL constants, a pipeline per
    size); None (default): :data:`CONSTANT_PARAMS` where set, else on every adapter but a CPU one.
    ``transpose_weights``: as :func:`eggfuse.lowering.lower`'s (a tiled product reads a transposed copy of its
    weight where the other layout loads faster; None: ``lowering.layout.TRANSPOSE_WEIGHTS``). On Metal the
    plan keeps split-K products in two dispatches (:func:`device_barriers_for`). Raises
    InputError for a ``runtime_checks`` or ``constant_params`` not None/True/False, a bad EGGFUSE_RUNTIME_CHECKS, for
    ``subgroups`` not None/True/False or True on a device without them, LoweringError when
    the graph exceeds the device's limits (on a CPU adapter also the loops lavapipe would cut short:
    ``lowering.plan.check_cpu_loops``), DeviceError when there is no device.
    """
    from eggfuse.runtime.device import get_device

    require_graph("lower_for", graph)
    device = device if device is not None else get_device()
    cpu = device.adapter.info.get("adapter_type") == "CPU"
    if prefetch is None:
        prefetch = not cpu
    plan = lower(graph, dict(device.limits), subgroups=subgroups_for(device, subgroups), prefetch=bool(prefetch),
                 runtime_checks=runtime_checks_for(runtime_checks),
                 constant_params=constant_params_for(device, constant_params),
                 device_barriers=device_barriers_for(device), transpose_weights=transpose_weights)
    if cpu:  # lavapipe cuts long shader loops short, silently
        from eggfuse.lowering.plan import check_cpu_loops

        check_cpu_loops(plan)
    return plan


def device_barriers_for(device) -> bool:
    """Whether lowering for ``device`` may let workgroups pass values through atomics ordered by ``storageBarrier``
    (``eggfuse.lowering.lower``'s ``device_barriers``): on every backend but Metal, where naga's ``storageBarrier``
    is a threadgroup barrier (``threadgroup_barrier(mem_flags::mem_device)``)."""
    return device.adapter.info.get("backend_type") != "Metal"


#: What :func:`lower_for`'s ``constant_params=None`` means when set (True or False on every adapter), for
#: timing the form: ``bench/plan_ab.py --variant uniform:eggfuse.pipeline.CONSTANT_PARAMS=False``.
CONSTANT_PARAMS: bool | None = None


def constant_params_for(device, constant_params: bool | None) -> bool:
    """``constant_params`` of :func:`lower_for` and :func:`compile`: True or False as given; None:
    :data:`CONSTANT_PARAMS` where set, else True on every adapter but a CPU one (lavapipe, where a pipeline
    compiled per size costs more than it saves in a run or two: ``lowering.lower``). Raises InputError for
    another value."""
    if isinstance(constant_params, bool):
        return constant_params
    if constant_params is not None:
        raise InputError(f"constant_params must be None, True or False, got {constant_params!r}")
    if CONSTANT_PARAMS is not None:
        return CONSTANT_PARAMS
    return device.adapter.info.get("adapter_type") != "CPU"


#: The environment variable that makes :func:`lower_for` and :func:`compile` keep naga's runtime checks.
RUNTIME_CHECKS_ENV = "EGGFUSE_RUNTIME_CHECKS"


def runtime_checks_for(runtime_checks: bool | None) -> bool:
    """``runtime_checks`` of :func:`lower_for`: True or False as given; None reads the environment
    variable EGGFUSE_RUNTIME_CHECKS: ``1`` keeps naga's runtime checks in every kernel (for debugging a
    kernel: an index out of bounds is then clamped), ``0`` or unset leaves them out where kernels allow
    (:func:`eggfuse.lowering.lower`, which checks a value given). Raises InputError for another value
    of the variable."""
    if runtime_checks is not None:
        return runtime_checks
    value = os.environ.get(RUNTIME_CHECKS_ENV, "0")
    if value not in ("0", "1"):
        raise InputError(f"{RUNTIME_CHECKS_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


def subgroups_for(device, subgroups: bool | None) -> bool:
    """Whether lowering for ``device`` uses subgroup operations, for :func:`lower_for`'s
    ``subgroups`` (the probe runs once per device). Raises InputError as :func:`lower_for`."""
    from eggfuse.runtime.device import subgroup_reductions_usable

    if subgroups is not None and not isinstance(subgroups, bool):
        raise InputError(f"subgroups must be None, True or False, got {subgroups!r}")
    usable = subgroups is not False and subgroup_reductions_usable(device)
    if subgroups and not usable:
        raise InputError("subgroups=True, but this device has no usable subgroup operations "
                         "(runtime.device.subgroup_reductions_usable)")
    return usable


#: ``precision=`` of :func:`compile`: how weights are stored on the device.
PRECISIONS = ("f32", "f16")


def precision_rulesets(precision: str, rulesets: Sequence[Ruleset] | None = None) -> Sequence[Ruleset] | None:
    """The rulesets that :func:`compile` runs for ``precision``: ``rulesets`` (None: the shipped
    ones) as given for ``"f32"``; for ``"f16"`` the optional ``f16`` ruleset first, then those (as
    given where they hold it already: ``rewrites.rulesets.select(..., precision="f16")``, with some
    of its rules left out). Raises InputError for another precision, and for ``"f32"`` with rulesets
    that hold the f16 ruleset."""
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "f32" and rulesets is None:
        return None
    from eggfuse.rewrites.rulesets import optional_ruleset, ruleset_name, scheduled_rulesets

    holds_f16 = rulesets is not None and any(ruleset_name(rs) == "f16" for rs in rulesets)
    if precision == "f32":
        if holds_f16:
            raise InputError("the rulesets hold the f16 ruleset, which rounds weights to float16: compile with "
                             "precision='f16' (select(..., precision='f16') gives the rulesets for it)")
        return rulesets
    if holds_f16:
        return rulesets
    return (optional_ruleset("f16"), *(scheduled_rulesets() if rulesets is None else rulesets))


def compile(graph: Graph, params: Mapping[str, np.ndarray], *, fuse: bool = True,
            cost_model: CostModel | None = None, rulesets: Sequence[Ruleset] | None = None, verify: bool = False,
            device=None, share: Session | None = None, subgroups: bool | None = None,
            prerecord: bool = True, finite_inputs: bool = True, finite_parameters: bool = True, cache: bool = True,
            precision: str = "f32", constant_params: bool | None = None,
            transpose_weights: bool | None = None) -> Compiled:
    """Optimise ``graph`` with the egglog rulesets (``fuse=True``), lower it for ``device`` and
    bind it: parameters uploaded once, pipelines and bind groups built.

    ``cost_model``, ``rulesets`` and ``verify`` go to :func:`optimize`: ``rulesets`` None runs
    the shipped ones, ``[*optimization_rulesets(), mine]`` adds a ruleset of one's own
    (``eggfuse.rewrites.make_ruleset``).

    ``share`` binds to another session's buffers of the same names (weights, KV caches: see
    ``Session``), and then keeps every weight as stored (``lowering.layout``: no transposed copies, which
    the other session's buffers are not; a weight the other session holds only transposed raises InputError:
    compile that one with ``transpose_weights=False``); ``transpose_weights`` as :func:`lower_for`'s (None: on,
    but off with ``share``; part of the compile cache's key); ``subgroups`` and ``constant_params`` as
    :func:`lower_for` (the latter part of the compile cache's key: :func:`constant_params_for`); kernels keep
    naga's runtime checks when the environment variable EGGFUSE_RUNTIME_CHECKS is 1
    (:func:`runtime_checks_for`); ``prerecord``
    and ``finite_inputs`` / ``finite_parameters`` (False: float inputs / parameters may hold NaN and
    infinities) as ``Session``.
    ``cache=True`` loads the optimised graph and the plan from the compile cache when an earlier
    compile stored them, and stores them otherwise (:mod:`eggfuse.cache`: keyed by the graph,
    the optimiser's arguments, the device and the versions; never by parameter values);
    ``cache=False`` skips it. With ``verify=True`` a loaded graph is verified too.

    ``precision="f16"`` adds the ``f16`` ruleset (``ir/ops/half.py``), which offers every matmul
    weight stored [N, K] (``MatMulBT``, K a multiple of 32) and every embedding table (rows a
    multiple of 32 long) rounded to float16 (``ToF16``, round to nearest even, packed once per
    session on the host). The cost model sees the halved bytes and picks it; the kernels decode
    the halves while loading and compute, accumulate and keep every statistic (norms, softmax,
    attention) in f32. What is stored f16 is those weights only: activations, KV caches, norm
    weights, biases and other parameters stay f32. No device feature is needed (core WGSL's
    ``unpack2x16float``), so every device runs it. Weights outside float16's range are refused
    (InputError, when the session is created). ``verify=True`` compares with the f32 graph and
    would refuse the rounding: use it with ``"f32"``.

    The accepted inputs and parameters are those of ``graph`` as built, fused or not (the
    optimised graph keeps the leaves no output reads; a session checks a value given for one, as for the others,
    then ignores it).

    Raises :class:`~eggfuse.ir.GraphError` for a graph without outputs,
    :class:`~eggfuse.ir.InputError` for a ``graph`` that is not a Graph (an ONNX path or model: load it with
    ``eggfuse.onnx.load``), ``params`` that is not a mapping and for missing,
    unknown or mis-shaped parameters, for a ``cache`` that is not a bool, a ``transpose_weights`` not None/True/False,
    a weight ``share`` holds only transposed, a ``fuse``, ``verify`` or ``prerecord`` that is not a bool, a
    ``device`` that is not a wgpu device, and for an unknown ``precision`` or ``"f16"`` with ``fuse=False`` or
    ``verify=True``,
    :class:`~eggfuse.ir.RewriteError` for ``rulesets`` that is not a list of egglog Rulesets (names: select them with
    ``eggfuse.rewrites.select``) and if ``verify=True`` finds the optimised graph differs,
    :class:`~eggfuse.ir.LoweringError` when the device's limits are exceeded (its ``sources``: the
    nodes of ``graph`` concerned, through the optimisation) and
    :class:`~eggfuse.ir.DeviceError` when no wgpu adapter exists. ``graph`` and ``params``
    are not modified.
    """
    from eggfuse.runtime import Session  # wgpu is only imported when something runs
    from eggfuse.runtime.device import get_device

    require_graph("eggfuse.compile", graph)
    graph.check_outputs()  # both checked before the (slower) optimisation
    check_mapping("parameter", params, graph.parameters)
    if device is not None and not (hasattr(device, "limits") and hasattr(device, "adapter")):
        raise InputError(f"device must be a wgpu device (eggfuse.runtime.device.get_device() gives the process's) or "
                         f"None for that one, got {type(device).__name__} {device!r}")
    for name, flag in (("fuse", fuse), ("verify", verify), ("cache", cache), ("prerecord", prerecord)):
        if not isinstance(flag, bool | np.bool_):
            raise InputError(f"{name} must be True or False, got {flag!r}")
    if transpose_weights is not None and not isinstance(transpose_weights, bool):
        raise InputError(f"transpose_weights must be True, False or None, got {transpose_weights!r}")
    if rulesets is not None:
        from eggfuse.rewrites.rulesets import check_ruleset_objects

        check_ruleset_objects(rulesets, "eggfuse.compile")
    rulesets = precision_rulesets(precision, rulesets)
    if precision == "f16" and (not fuse or verify):
        raise InputError("precision='f16' is chosen by the rewrite engine (the f16 ruleset rounds weights), so it "
                         f"needs fuse=True and verify=False; got fuse={fuse!r}, verify={verify!r}")
    timings: dict[str, float] = {}
    t = time.perf_counter()
    if device is None:
        device = share.device if share is not None else get_device()
    usable = subgroups_for(device, subgroups)
    checks = runtime_checks_for(None)
    timings["device_s"] = time.perf_counter() - t
    optimizer = {"cost_model": cost_model, "rulesets": rulesets}  # what reaches the rewrite engine (and the key)
    constants = constant_params_for(device, constant_params)
    # a session that binds another's weights reads them as that one stores them
    if transpose_weights is None:
        from eggfuse.lowering import layout

        transpose_weights = layout.TRANSPOSE_WEIGHTS and share is None
    store, key, loaded = _cache_lookup(graph, cache, fuse, optimizer, device, usable, checks, constants,
                                       transpose_weights)
    if loaded is not None:
        run_graph, report, plan = ((loaded.graph, loaded.report, loaded.plan) if fuse
                                   else (graph.copy(), None, loaded.plan))
        if fuse:
            timings["optimize_s"] = loaded.optimize_s
            verified = None
            if verify:
                t = time.perf_counter()
                from eggfuse.rewrites import verify_equivalent

                verified = verify_equivalent(graph, run_graph)
                timings["optimize_s"] += time.perf_counter() - t
            if report is not None:  # this call's verification, not the one of the call that stored it
                report = dataclasses.replace(report, verified_max_diff=verified)
        timings["lower_s"] = loaded.lower_s + (0.0 if fuse else loaded.optimize_s)
    else:
        report = None
        run_graph = graph if fuse else graph.copy()  # the graph that runs, whatever becomes of the caller's
        if fuse:
            t = time.perf_counter()
            run_graph, report = optimize(graph, **optimizer, verify=verify)
            timings["optimize_s"] = time.perf_counter() - t
        t = time.perf_counter()
        try:
            plan = lower_for(run_graph, device, subgroups=usable, runtime_checks=checks, constant_params=constants,
                             transpose_weights=transpose_weights)
        except LoweringError as e:
            if report is not None:  # the nodes of ``graph`` the optimised nodes compute
                e.sources = tuple(sorted({i for n in e.nodes for i in report.origins.get(n, ())}))
            raise
        timings["lower_s"] = time.perf_counter() - t
        if store is not None:
            t = time.perf_counter()
            stored = dataclasses.replace(report, verified_max_diff=None) if report is not None else None
            if store.store(key, run_graph if fuse else None, stored, plan) is None:
                store = None  # not written (logged): no cache for this compile, said as "off"
            else:
                timings["cache_write_s"] = time.perf_counter() - t
    t = time.perf_counter()
    session = Session(plan, params, device=device, share=share, prerecord=prerecord, finite_inputs=finite_inputs,
                      finite_parameters=finite_parameters)
    timings["bind_s"] = time.perf_counter() - t
    timings["compile_s"] = timings["lower_s"] + timings["bind_s"]
    status = "off" if store is None else "hit" if loaded is not None else "miss"
    steps = (("optimize", "lower") if fuse else ("lower",)) if loaded is not None else ()
    return Compiled(run_graph, plan, session, report, graph.dispatch_count(), run_graph.dispatch_count(), timings,
                    status, steps)


def _cache_lookup(graph: Graph, cache: bool, fuse: bool, optimizer: dict, device, subgroups: bool,
                  runtime_checks: bool, constant_params: bool, transpose_weights: bool):
    # (the cache, the key, the entry loaded or None); the cache and key are None when it is off
    # or the compile cannot be keyed (an optimiser argument that is not plain data).
    from eggfuse.ir.ops.matmul_kernel import matmul_choice_active

    if not cache or matmul_choice_active():  # a forced matmul tile or split count: not in the key
        return None, None, None
    from eggfuse.cache import CompileCache, Unstorable, device_identity, entry_key

    t = time.perf_counter()
    try:
        key = entry_key(graph, fuse=fuse, optimizer=optimizer, device=device_identity(device), subgroups=subgroups,
                        runtime_checks=runtime_checks, constant_params=constant_params,
                        transpose_weights=transpose_weights)
    except (Unstorable, OSError):  # OSError: eggfuse's source files could not be read for the digest
        return None, None, None
    store = CompileCache()
    return store, key, store.load(key, runs=None if fuse else graph, started=t)


__all__ = ["CONSTANT_PARAMS", "PRECISIONS", "RUNTIME_CHECKS_ENV", "Compiled", "compile", "constant_params_for",
           "device_barriers_for", "lower_for", "optimize", "precision_rulesets", "runtime_checks_for", "subgroups_for"]
