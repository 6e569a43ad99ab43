"""A roofline cost model: per-dispatch latency plus the longer of memory and compute time.

A kernel's predicted GPU time is (Williams, Waterman & Patterson 2009, "Roofline: an
insightful visual performance model", with a fixed launch cost per dispatch added)::

    t = dispatches * dispatch_s + max(bytes / bandwidth, flops / peak_flops)

``bytes`` is ``bytes_read + bytes_written`` and ``flops`` the op's FLOPs
(``OpSpec.count_flops``), both from the :class:`~.cost.KernelInfo`. The unit of
:meth:`RooflineCostModel.kernel_cost` is nanoseconds (fractions kept; any unit would do, see
:class:`~.cost.CostModel`). A :class:`DeviceProfile` holds the three constants; :data:`PROFILES` has one per
device measured, and :func:`fit_profile` calibrates one from per-kernel GPU times
(``bench/cost_model.py`` measures those with timestamp queries and calls it).

This module needs numpy and the IR only (no egglog): ``bench/cost_model.py`` prices plans
with it on a GPU machine that has no rewrite engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..ir import InputError
from ..ir.sources import call_without_arguments, named_object
from .cost import CostModel, KernelInfo


@dataclass(frozen=True)
class DeviceProfile:
    """The roofline constants of one device: ``dispatch_s`` seconds per dispatch,
    ``bandwidth`` bytes per second, ``peak_flops`` FLOP per second; ``source`` says how they
    were obtained (a calibration run, or provisional figures)."""

    name: str
    dispatch_s: float
    bandwidth: float
    peak_flops: float
    source: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


#: Device profiles. ``lavapipe``: fitted by ``bench/cost_model.py --calibrate`` on this
#: project's development machine (Mesa lavapipe on 2 shared CPU cores; per-kernel timestamp
#: queries on the shipped models' fused and unfused plans, 2 layers; the fit in
#: ``bench/results/cost_model_lavapipe_calibration.json``, checked on a second run in
#: ``bench/results/cost_model_lavapipe.json``): a CPU is bound by arithmetic here, so the fit
#: gives memory a bandwidth too high to matter. ``h200``: provisional figures from
#: the README's H200 measurements (3.8 TB/s copy bandwidth, 31.8 TFLOP/s fp32 matmul, ~6 us a
#: dispatch) until ``bench/cost_model.py --calibrate`` runs there.
PROFILES: dict[str, DeviceProfile] = {
    "lavapipe": DeviceProfile("lavapipe", 6.0e-5, 2.35e13, 2.5e9,
                              "fitted by bench/cost_model.py --quick --calibrate lavapipe (300 kernels; llvmpipe, "
                              "LLVM 15, 2 shared cores): compute-bound, the fit left memory unlimited"),
    "h200": DeviceProfile("h200", 6.0e-6, 3.8e12, 3.18e13,
                          "provisional: README's H200 figures (copy bandwidth, 4096^3 matmul), not fitted"),
}


class RooflineCostModel(CostModel):
    """Roofline cost in nanoseconds under a :class:`DeviceProfile` (a name of
    :data:`PROFILES`, default ``h200``, or a profile). Raises :class:`~eggfuse.ir.InputError`
    for an unknown profile name."""

    def __init__(self, profile: str | DeviceProfile = "h200") -> None:
        if isinstance(profile, str):
            if profile not in PROFILES:
                raise InputError(f"unknown device profile {profile!r}: profiles are {', '.join(PROFILES)}")
            profile = PROFILES[profile]
        self.profile = profile
        super().__init__(dispatch_bytes=0)

    def seconds(self, k: KernelInfo) -> float:
        """Predicted GPU seconds of one kernel (or epilogue operand read)."""
        p = self.profile
        return k.dispatches * p.dispatch_s + max((k.bytes_read + k.bytes_written) / p.bandwidth,
                                                 k.flops / p.peak_flops)

    def kernel_cost(self, k: KernelInfo) -> float:
        """:meth:`seconds` in nanoseconds, fractions kept (a small epilogue read costs under 1 ns)."""
        return self.seconds(k) * 1e9


def fit_profile(samples: Sequence[tuple[KernelInfo, float]], name: str, source: str = "",
                iterations: int = 20) -> DeviceProfile:
    """The :class:`DeviceProfile` whose roofline best predicts ``samples`` (kernel, measured
    seconds): least squares on the relative error, constants kept non-negative.

    Each kernel is bound by memory or by compute under the current constants; given that
    assignment the fit is linear in (dispatch_s, 1/bandwidth, 1/peak_flops), solved with
    every non-negative subset of the three (numpy only); repeated until the assignment stops
    changing (at most ``iterations`` times). Raises :class:`~eggfuse.ir.InputError` for fewer
    than three samples or non-positive times.
    """
    if len(samples) < 3:
        raise InputError(f"fit_profile needs at least 3 measured kernels, got {len(samples)}")
    n = np.array([k.dispatches for k, _ in samples], dtype=np.float64)
    b = np.array([k.bytes_read + k.bytes_written for k, _ in samples], dtype=np.float64)
    f = np.array([k.flops for k, _ in samples], dtype=np.float64)
    t = np.array([s for _, s in samples], dtype=np.float64)
    if np.any(t <= 0):
        raise InputError("fit_profile: every measured time must be positive")
    memory = np.ones(len(t), dtype=bool)  # start from the additive fit: both terms for every kernel
    x = _nonneg_lstsq(np.stack([n, b, f], axis=1) / t[:, None], np.ones(len(t)))
    for _ in range(iterations):
        bound = b * x[1] >= f * x[2]
        if _ and np.array_equal(bound, memory):
            break
        memory = bound
        design = np.stack([n, np.where(memory, b, 0.0), np.where(memory, 0.0, f)], axis=1) / t[:, None]
        x = _nonneg_lstsq(design, np.ones(len(t)))
    tiny = 1e-30  # a term the fit dropped: an (effectively) unlimited resource
    return DeviceProfile(name, float(x[0]), float(1.0 / max(x[1], tiny)), float(1.0 / max(x[2], tiny)), source)


def _nonneg_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """argmin |a x - y| over x >= 0, for the few columns here: every subset of columns tried."""
    cols = a.shape[1]
    best, best_err = np.zeros(cols), float(np.sum(y * y))
    for mask in range(1, 1 << cols):
        idx = [c for c in range(cols) if mask >> c & 1]
        sol, *_ = np.linalg.lstsq(a[:, idx], y, rcond=None)
        if np.any(sol < 0):
            continue
        x = np.zeros(cols)
        x[idx] = sol
        err = float(np.sum((a @ x - y) ** 2))
        if err < best_err:
            best, best_err = x, err
    return best


COST_MODELS = ("bytes", "roofline", "roofline:PROFILE", "module:Class")


def cost_model_from_spec(spec: str) -> CostModel:
    """A cost model by name: ``bytes`` (:class:`~.cost.CostModel`, byte-equivalents),
    ``roofline`` (:class:`RooflineCostModel` with the ``h200`` profile), ``roofline:PROFILE``
    (a profile of :data:`PROFILES`), or ``module:Class`` / ``path/to/file.py:Class`` (a
    :class:`~.cost.CostModel` subclass there, made with no arguments; a module of the current folder
    imports too). Raises :class:`~eggfuse.ir.InputError` for an unknown name, a module or class that
    does not import, a class that is not a ``CostModel`` or that needs arguments."""
    if spec == "bytes":
        return CostModel()
    if spec == "roofline":
        return RooflineCostModel()
    if spec.startswith("roofline:"):
        return RooflineCostModel(spec.split(":", 1)[1])
    if ":" not in spec:
        raise InputError(f"unknown cost model {spec!r}: use {', '.join(COST_MODELS)}")
    cls = named_object(spec, "cost model", "class")
    if not (isinstance(cls, type) and issubclass(cls, CostModel)):
        raise InputError(f"cost model {spec!r} is not a subclass of eggfuse.rewrites.CostModel")
    return call_without_arguments(cls, spec, "cost model")


__all__ = ["COST_MODELS", "PROFILES", "DeviceProfile", "RooflineCostModel", "cost_model_from_spec", "fit_profile"]
