"""Attention ops reading an i32 or a bool key_mask (ir/ops/attention.py KEY_MASK_DTYPES, as the
rule _key_mask_without_casts hands them an exporter's padding mask): on both kernels
(attention_lanes.wgsl and attention.wgsl), every forward op, packed or not, masked_rows "mean" and
"zero", the numbers of the same op given the f32 mask of the keys Cast(mask, bool) keeps (1.0 where
the mask is non-zero or true, 0.0 elsewhere), that mask made here with numpy and the expected
values from the numpy reference (eggfuse.ir.evaluate) of that f32 graph."""

from __future__ import annotations

import numpy as np
import pytest

from eggfuse.ir import DType, Graph, evaluate
from eggfuse.ir.ops import attention as attention_module
from eggfuse.pipeline import lower_for
from eggfuse.runtime import Session

BATCH, SEQ, NH, NKV, HD = 3, 5, 4, 2, 8

# (op, packed, lanes): q, k and v as three inputs, or one [rows, (H + 2 KV) * D] input; on attention_lanes.wgsl
# (the ops of LANES_OPS, by default) or attention.wgsl (LANES_OPS emptied)
FORMS = [(op, packed, lanes) for op, packed in (("FullAttention", False), ("FullAttentionPacked", True),
                                                ("CausalAttention", False), ("CausalAttention", True),
                                                ("CausalAttentionRoPE", False), ("CausalAttentionRoPE", True))
         for lanes in ((True, False) if op in attention_module.LANES_OPS else (False,))]


def _mask(dtype: DType) -> np.ndarray:
    # values of both signs and zeros; sequence 1 keeps no key, sequence 2 drops its first two (left padding: its
    # first causal rows keep none of theirs)
    m = np.array([[2, -1, 0, 1, -3], [0, 0, 0, 0, 0], [0, 0, 5, -2, 1]], dtype=np.int32)
    return m.astype(bool) if dtype is DType.BOOL else m


def _graph(op: str, packed: bool, mask_dtype: DType, masked_rows: str) -> Graph:
    g = Graph()
    rows = BATCH * SEQ
    widths = [(NH + 2 * NKV) * HD] if packed else [NH * HD, NKV * HD, NKV * HD]
    ins = [g.input(name, [rows, w]) for name, w in zip(["qkv"] if packed else ["q", "k", "v"], widths, strict=True)]
    rope = {"theta": 100.0} if op == "CausalAttentionRoPE" else {}
    mask = g.input("key_mask", [BATCH, SEQ], mask_dtype)
    g.set_outputs([g.add_node(op, (*ins, mask), num_heads=NH, num_kv_heads=NKV, head_dim=HD, batch=BATCH,
                              masked_rows=masked_rows, **rope)])
    return g


@pytest.mark.parametrize("masked_rows", ["mean", "zero"])
@pytest.mark.parametrize("dtype", [DType.I32, DType.BOOL], ids=["i32", "bool"])
@pytest.mark.parametrize("op,packed,lanes", FORMS,
                         ids=[f"{op}{'-packed' if p else ''}-{'lanes' if la else 'tiled'}" for op, p, la in FORMS])
def test_an_i32_or_bool_key_mask_keeps_the_keys_its_cast_to_bool_keeps(op, packed, lanes, dtype, masked_rows,
                                                                       device, monkeypatch):
    if not lanes:
        monkeypatch.setattr(attention_module, "LANES_OPS", ())
    rng = np.random.default_rng(3)
    feeds = {name: rng.standard_normal((BATCH * SEQ, w)).astype(np.float32)
             for name, w in ((("qkv", (NH + 2 * NKV) * HD),) if packed else
                             (("q", NH * HD), ("k", NKV * HD), ("v", NKV * HD)))}
    mask = _mask(dtype)
    g = _graph(op, packed, dtype, masked_rows)
    plan = lower_for(g, device)
    (attention,) = [d for d in plan.dispatches if "attention" in d.kernel]
    assert f"_mask_{dtype.value}" in attention.kernel and ("lanes" in attention.kernel) == lanes, attention.kernel
    (got,) = Session(plan, {}, device=device).run({**feeds, "key_mask": mask})
    kept = (mask != 0).astype(np.float32)  # Cast(mask, bool), then to f32: 1 keeps a key
    (want,) = evaluate(_graph(op, packed, DType.F32, masked_rows), {**feeds, "key_mask": kept}, {})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)
    if masked_rows == "zero":  # the sequence that keeps no key: zeros (its rows are not all zero otherwise)
        assert not got[SEQ:2 * SEQ].any() and got[:SEQ].any()


def test_a_key_mask_of_another_dtype_is_refused_by_name():
    g = Graph()
    q = g.input("q", [BATCH * SEQ, NH * HD])
    k, v = g.input("k", [BATCH * SEQ, NKV * HD]), g.input("v", [BATCH * SEQ, NKV * HD])
    with pytest.raises(Exception, match=r"key_mask must be f32, i32 or bool, got .*u32"):
        g.full_attention(q, k, v, NH, NKV, HD, BATCH, key_mask=g.input("key_mask", [BATCH, SEQ], DType.U32))


@pytest.mark.parametrize("packed", [False, True], ids=["qkv", "packed"])
@pytest.mark.parametrize("dtype", [DType.I32, DType.BOOL], ids=["i32", "bool"])
def test_the_gradient_through_an_i32_or_bool_key_mask_is_that_of_its_f32_form(dtype, packed, device):
    # the AttentionGrad kernels take an f32 mask: the gradient casts the mask (Cast to bool, then f32); on the GPU,
    # against the numpy reference's gradient of the graph given the f32 mask
    from eggfuse.ir.autodiff import grad

    def training(mask_dtype: DType):
        g = Graph()
        op = "FullAttentionPacked" if packed else "FullAttention"
        widths = [(NH + 2 * NKV) * HD] if packed else [NH * HD, NKV * HD, NKV * HD]
        ins = [g.parameter(n, [BATCH * SEQ, w]) for n, w in zip(["qkv"] if packed else ["q", "k", "v"], widths,
                                                                  strict=True)]
        out = g.add_node(op, (*ins, g.input("key_mask", [BATCH, SEQ], mask_dtype)), num_heads=NH, num_kv_heads=NKV,
                         head_dim=HD, batch=BATCH, masked_rows="zero")
        loss = g.mean_all(g.mul(out, g.input("w", [BATCH * SEQ, NH * HD])))
        return grad(g, loss)

    rng = np.random.default_rng(5)
    params = {n: rng.standard_normal((BATCH * SEQ, w)).astype(np.float32)
              for n, w in ((("qkv", (NH + 2 * NKV) * HD),) if packed else
                           (("q", NH * HD), ("k", NKV * HD), ("v", NKV * HD)))}
    w = rng.standard_normal((BATCH * SEQ, NH * HD)).astype(np.float32)
    mask = _mask(dtype)
    tg = training(dtype)
    got = Session(lower_for(tg, device), params, device=device).run({"key_mask": mask, "w": w})
    want = evaluate(training(DType.F32), {"key_mask": (mask != 0).astype(np.float32), "w": w}, params)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
