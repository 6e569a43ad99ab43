"""Normalisations fused into their consumer: RmsNorm into a matmul, Silu into GroupNorm."""

from __future__ import annotations

from egglog import String, ruleset

from .dsl import equal
from .sorts import Epi, T

norm_fusion_ruleset = ruleset(name="norm_fusion")


@norm_fusion_ruleset.register
def _rms_norm_matmul(attrs: String, x: T, w: T, wp: T, e: Epi):
    # FusedMatMul(RmsNorm(x, w), W, e) -> FusedRmsNormMatMul(x, w, W, e)   (W [K,N], or [N,K] for BT)
    for v in ("", "BT"):
        yield equal(f"FusedMatMul{v}(RmsNorm(x,w), W, e) -> FusedRmsNormMatMul{v}(x, w, W, e)",
                    T.fused_matmul(v, T.rms_norm(attrs, x, w), wp, e),
                    T.fused_rms_norm_matmul(attrs, v, x, w, wp, e))


@norm_fusion_ruleset.register
def _group_norm_silu(attrs: String, x: T, w: T, b: T):
    # Silu(GroupNorm(x, w, b)) -> GroupNormSilu(x, w, b)
    yield equal("Silu(GroupNorm(x,w,b)) -> GroupNormSilu(x,w,b)", T.silu(T.group_norm(attrs, x, w, b)),
                T.group_norm_silu(attrs, x, w, b))
