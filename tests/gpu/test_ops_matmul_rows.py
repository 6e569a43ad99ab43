"""The products with a final row step (ir/ops/matmul_rows.py) on the GPU: FusedMatMulLayerNorm,
FusedMatMulLayerNormPair, FusedMatMulRmsNorm, FusedMatMulSwiGLU and FusedRmsNormMatMulSwiGLU (their quantised-weight
forms: tests/gpu/test_ops_quant.py) against the numpy reference (``eggfuse.ir.evaluate``),
through every first stage (the GEMV kernel for M <= 4 and 'BT' products of up to 16 rows, the tiled kernel whole
or split in K) and an
epilogue before the final step. Then the rules on graphs of primitive ops (BERT's bias + residual +
LayerNorm, a LLaMA MLP), optimised and run against the unfused graph's reference, with the product
also a graph output (the fusion must leave it, and the numbers, alone) and with odd sizes."""

from __future__ import annotations

import re

import numpy as np
import pytest
from op_table import Row, check_row, run_optimised  # tests/op_table.py

from eggfuse.ir import Graph
from eggfuse.ir.ops.matmul_kernel import matmul_choice, matmul_tile
from eggfuse.lowering import lower


def _operands(g: Graph, epilogue, m: int, n: int) -> list[int]:
    out = []
    for i, step in enumerate(epilogue):
        if step == "bias":
            out.append(g.parameter(f"bias{i}", [n]))
        elif step == "add":
            out.append(g.input(f"res{i}", [m, n]))
    return out


def _layer_norm(variant: str, m: int, k: int, n: int, epilogue=("bias", "add"), pair: bool = False) -> Row:
    # pair: FusedMatMulLayerNormPair, the product's rows stored too ([2, M, N])
    op, eps = ("FusedMatMulLayerNormPair", 1e-5) if pair else ("FusedMatMulLayerNorm", 1e-12)

    def build(g: Graph) -> int:
        a = g.input("a", [k, m] if variant == "AT" else [m, k])
        w = g.parameter("w", [n, k] if variant == "BT" else [k, n])
        gamma, beta = g.parameter("gamma", [n]), g.parameter("beta", [n])
        return g.add_node(op, (a, w, gamma, beta, *_operands(g, epilogue, m, n)), eps=eps, variant=variant,
                          epilogue=epilogue)

    return Row(op, f"{op}{variant}[{m},{k},{n}]{'+'.join(epilogue)}", build)


def _rms_norm(variant: str, m: int, k: int, n: int, epilogue=("bias",), eps: float = 1e-6) -> Row:
    def build(g: Graph) -> int:
        a = g.input("a", [k, m] if variant == "AT" else [m, k])
        w = g.parameter("w", [n, k] if variant == "BT" else [k, n])
        return g.add_node("FusedMatMulRmsNorm", (a, w, g.parameter("w_norm", [n]), *_operands(g, epilogue, m, n)),
                          eps=eps, variant=variant, epilogue=epilogue)

    return Row("FusedMatMulRmsNorm", f"FusedMatMulRmsNorm{variant}[{m},{k},{n}]{'+'.join(epilogue)}eps{eps:g}", build)


def _swiglu(rms: bool, variant: str, m: int, k: int, n: int, epilogue=("bias",)) -> Row:
    op = "FusedRmsNormMatMulSwiGLU" if rms else "FusedMatMulSwiGLU"

    def build(g: Graph) -> int:
        x = g.input("x", [k, m] if variant == "AT" else [m, k])
        w = g.parameter("w", [2 * n, k] if variant == "BT" else [k, 2 * n])
        head = (x, g.parameter("w_norm", [k]), w) if rms else (x, w)
        attrs = {"eps": 1e-5} if rms else {}
        return g.add_node(op, (*head, *_operands(g, epilogue, m, 2 * n)), variant=variant, epilogue=epilogue,
                          **attrs)

    return Row(op, f"{op}{variant}[{m},{k},{2 * n}]{'+'.join(epilogue)}", build)


ROWS = [
    _layer_norm("BT", 1, 40, 37),  # GEMV first stage
    _layer_norm("BT", 37, 384, 45),  # tiled, split in K by the heuristic
    _layer_norm("", 70, 33, 300, ("bias", "Gelu")),
    _layer_norm("AT", 9, 20, 6, ()),
    _layer_norm("", 2, 40, 30, ("Relu",)),  # GEMV first stage, B stored [K, N]
    _layer_norm("BT", 17, 24, 257, ("add",)),  # 2 columns an invocation in registers, the second only for one
    _layer_norm("BT", 17, 20, 4500, ("bias",)),  # rows too long for registers: each pass computes them again
    _layer_norm("BT", 9, 24, 257, ("add",)),  # GEMV first stage of 9 rows ('BT' up to 16: gemv_bt_rows)
    _layer_norm("BT", 1, 40, 37, pair=True),  # GEMV first stage
    _layer_norm("BT", 37, 384, 48, pair=True),  # quads, split in K by the heuristic
    _layer_norm("", 70, 33, 389, ("bias", "GeluTanh"), pair=True),  # single columns, in registers
    _layer_norm("AT", 9, 20, 6, (), pair=True),
    _layer_norm("BT", 17, 20, 4500, ("bias",), pair=True),  # rows too long for registers: each pass computes them
    _layer_norm("BT", 5, 20, 4500, ("bias",), pair=True),  # the same after a GEMV first stage of 5 rows
    _rms_norm("BT", 1, 40, 37, ("add",)),  # GEMV first stage
    _rms_norm("", 8, 1024, 384, ()),  # MiniLM's pooling product (8 rows): tiled, split in K by the heuristic
    _rms_norm("AT", 37, 33, 45, ("bias", "Gelu")),
    _rms_norm("BT", 17, 24, 4500),  # rows too long for registers
    _rms_norm("BT", 8, 24, 4500),  # the same after a GEMV first stage of 8 rows
    _rms_norm("BT", 17, 12, 45, (), eps=10.0),  # eps near mean(C^2) (about K): a wrong eps shows
    _swiglu(False, "AT", 2, 9, 5, ("bias",)),  # GEMV first stage, A stored [K, M]
    _swiglu(False, "BT", 3, 64, 20),
    _swiglu(False, "", 40, 300, 33, ("bias", "add")),
    _swiglu(False, "AT", 17, 9, 5, ()),
    _swiglu(True, "BT", 2, 64, 24, ()),
    _swiglu(True, "BT", 8, 64, 20),  # GEMV first stage of 8 rows (an 8-token prefill's gate/up product)
    _swiglu(True, "BT", 37, 576, 48),
    _swiglu(True, "", 65, 30, 70, ("add",)),
]


def _gemv_first(row: Row) -> bool:
    # whether the row's product is the GEMV kernel's (one K range: matmul_choice's splits do not apply)
    variant, m, k, n = re.fullmatch(r"[A-Za-z]+?(AT|BT|)\[(\d+),(\d+),(\d+)\].*", row.id).groups()
    return matmul_tile(int(m), int(k), int(n), variant).gemv


def test_the_gemv_first_stages_are_the_rows_meant():
    assert [r.id.split("[")[1].split("]")[0] for r in ROWS if _gemv_first(r)] == [
        "1,40,37", "2,40,30", "9,24,257", "1,40,37", "5,20,4500", "1,40,37", "8,24,4500", "2,9,10", "3,64,40",
        "2,64,48", "8,64,40"]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_op_matches_reference(row, device):
    session = check_row(row, device, subgroups=None)
    assert len(session.plan.dispatches) == 2  # the product (or its partial sums), then the final step


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("row", [r for r in ROWS if not _gemv_first(r)], ids=lambda r: r.id)
def test_whole_and_split_first_stages(row, splits, device):
    with matmul_choice(splits=splits):
        session = check_row(row, device, subgroups=None)
    kernels = [d.kernel for d in session.plan.dispatches]
    final = {"FusedMatMulLayerNorm": "layer_norm", "FusedMatMulLayerNormPair": "layer_norm_pair",
             "FusedMatMulRmsNorm": "rms_norm"}.get(row.op)
    assert len(kernels) == 2 and kernels[1].startswith(f"matmul_split{splits}_{final}" if final else
                                                       f"matmul_split{splits}_reduce"), kernels
    assert (f"_split{splits}" in kernels[0]) == (splits > 1) and ("_split" in kernels[0]) == (splits > 1), kernels


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("fmt, layer_norm", [("q4_1", True), ("f16", True), ("q8_0", False), ("q4_0", False)])
def test_quantised_forms_whole_and_split(fmt, layer_norm, splits, device):
    from test_ops_quant import _quant  # tests/gpu/test_ops_quant.py (blocks by gguf's quantisers)

    with matmul_choice(splits=splits):
        session = check_row(_quant(fmt, layer_norm, 37, 32 * 11, 40, ("bias", "add")), device, subgroups=None)
    kernels = [d.kernel for d in session.plan.dispatches]
    assert len(kernels) == 2 and ("_split" in kernels[0]) == (splits > 1), kernels


@pytest.mark.parametrize("quads", [False, True])
@pytest.mark.parametrize("subgroups", [False, True])
@pytest.mark.parametrize("min_lanes", [4, 32])
@pytest.mark.parametrize("wg", [256, 64])
def test_layer_norm_rows_of_few_lanes(wg, min_lanes, subgroups, quads, monkeypatch, device):
    # The final stage's lanes a row (matmul_kernel.layer_norm_lanes): 4, 8 or 32 lanes; rows of 4 or 8 lie in
    # one of lavapipe's subgroups (the butterfly of row_lanes_subgroup.wgsl), rows of 32 span several (their
    # parts in workgroup memory); without subgroups the tree of row_lanes.wgsl. 70 rows: the last workgroup
    # holds rows past M. Rows of single columns or of quads (N % 4 == 0 here), which reach the same lanes. Workgroups
    # of 256 invocations and of 64 (LAYER_NORM_WG).
    import eggfuse.ir.ops.matmul_kernel as mk
    from eggfuse.runtime.device import subgroup_reductions_usable

    if subgroups and not subgroup_reductions_usable(device):
        pytest.skip("the device has no usable subgroups")
    monkeypatch.setattr(mk, "LAYER_NORM_MIN_LANES", min_lanes)
    monkeypatch.setattr(mk, "LAYER_NORM_QUAD_MIN_LANES", min_lanes)
    monkeypatch.setattr(mk, "LAYER_NORM_QUADS", quads)
    monkeypatch.setattr(mk, "LAYER_NORM_WG", wg)
    for m, k, n, epilogue in ((70, 33, 40, ("bias", "Gelu")), (9, 24, 100, ("add",)), (70, 20, 300, ())):
        session = check_row(_layer_norm("BT", m, k, n, epilogue), device, subgroups=subgroups)
        lanes, values, width = mk.layer_norm_lanes(n)
        assert width == (4 if quads else 1) and 0 < values * width <= mk.LAYER_NORM_HELD
        assert lanes == max(min_lanes, {40: 4, 100: 8, 300: 32}[n])
        final = session.plan.dispatches[1]
        assert final.kernel.endswith("+sg") == subgroups, final
        assert final.workgroups[0] == -(-m * lanes // mk.LAYER_NORM_WG), final


@pytest.mark.parametrize("subgroups", [False, True])
@pytest.mark.parametrize("m, k, n, splits", [(37, 24, 384, 3), (37, 24, 389, 1), (17, 12, 4500, 2)])
def test_layer_norm_stage_keeps_a_large_means_low_bits(m, k, n, splits, subgroups, device):
    # C = A W + residual, rows of mean 1000 and spread 0.01, every value exact in float32 (multiples of 2^-13 below
    # 2^11): the stage's output against float64's normalisation of the same C. With the mean rounded to one float
    # and d = C - mean squared, these were 9.5e-3 to 2.3e-2 off on lavapipe (onnxruntime's LayerNormalization of
    # C: 3.1e-3 and 2.5e-3 at 384 and 4500 columns); taking the rounding's remainder in the second pass, 2.8e-7 to
    # 6.5e-7. Quads (384), single columns (389), rows too long for registers (4500: each pass computes them
    # again); the row sums in subgroups and as a tree.
    from eggfuse.pipeline import lower_for
    from eggfuse.runtime import Session
    from eggfuse.runtime.device import subgroup_reductions_usable

    if subgroups and not subgroup_reductions_usable(device):
        pytest.skip("the device has no usable subgroups")
    rng = np.random.default_rng(n)
    step = 2.0 ** -13
    a = rng.integers(-1, 2, (m, k)).astype(np.float32)
    w = (rng.integers(-2, 3, (n, k)) * step).astype(np.float32)
    r = (1000.0 + np.round(0.01 * rng.standard_normal((m, n)) / step) * step).astype(np.float32)
    g = Graph()
    ins = (g.input("a", [m, k]), g.parameter("w", [n, k]), g.parameter("gamma", [n]), g.parameter("beta", [n]),
           g.input("r", [m, n]))
    out = g.add_node("FusedMatMulLayerNorm", ins, eps=1e-12, variant="BT", epilogue=("add",))
    g.set_outputs([out])
    params = {"w": w, "gamma": np.ones(n, np.float32), "beta": np.zeros(n, np.float32)}
    with matmul_choice(splits=splits):
        session = Session(lower_for(g, device, subgroups=subgroups), params, device=device)
    (got,) = session.run({"a": a, "r": r})
    c = a.astype(np.float64) @ w.astype(np.float64).T + r
    assert np.array_equal(c.astype(np.float32), c)  # exact in float32: what the stage sums is C itself
    want = (c - c.mean(-1, keepdims=True)) / np.sqrt(c.var(-1, keepdims=True) + 1e-12)
    err = float(np.abs(got - want).max())
    assert err < 1e-5, err
    assert session.plan.dispatches[1].kernel.startswith(f"matmul_split{splits}_layer_norm"), session.plan.dispatches


def test_gemv_first_stage(device):
    session = check_row(ROWS[0], device, subgroups=None)
    first, second = (d.kernel for d in session.plan.dispatches)
    assert "gemv" in first and second.startswith("matmul_split1_layer_norm+bias+add"), (first, second)
    (scratch,) = [b for b in session.plan.buffers if b.name.endswith(".scratch")]
    assert scratch.shape == (1 * 37,)


def _bert_block(m: int, k: int, n: int, product_out: bool) -> tuple[Graph, dict, dict]:
    g = Graph()
    x, r = g.input("x", [m, k]), g.input("r", [m, n])
    prod = g.matmul_bt(x, g.parameter("w", [n, k]))
    h = g.add(g.bias_add(prod, g.parameter("b", [n])), r)
    y = g.layer_norm(h, g.parameter("gamma", [n]), g.parameter("beta", [n]), eps=1e-12)
    g.set_outputs([y, h] if product_out else [y])
    rng = np.random.default_rng(m * 1000 + n)
    feeds = {"x": rng.standard_normal((m, k)).astype(np.float32), "r": rng.standard_normal((m, n)).astype(np.float32)}
    params = {"w": rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k),
              "b": rng.standard_normal(n).astype(np.float32), "gamma": rng.standard_normal(n).astype(np.float32),
              "beta": rng.standard_normal(n).astype(np.float32)}
    return g, feeds, params


@pytest.mark.parametrize("m, k, n", [(37, 384, 45), (5, 19, 7), (2, 64, 33)])
def test_layer_norm_rule_on_a_bert_block(m, k, n, device):
    g, feeds, params = _bert_block(m, k, n, product_out=False)
    opt, _ = run_optimised(g, device, feeds, params)
    assert [n.op for n in opt.live_nodes() if n.op == "FusedMatMulLayerNorm"] == ["FusedMatMulLayerNorm"]
    assert not any(n.op == "LayerNorm" for n in opt.live_nodes())


def test_layer_norm_rule_leaves_a_stored_product(device):
    # the pre-norm sum is a graph output too: it is stored anyway, so the norm reads it
    g, feeds, params = _bert_block(37, 64, 45, product_out=True)
    opt, _ = run_optimised(g, device, feeds, params)
    assert not any(n.op == "FusedMatMulLayerNorm" for n in opt.live_nodes())


def _pre_ln_blocks(m: int, k: int, n: int, layers: int, sum_out: bool) -> tuple[Graph, dict, dict]:
    # GPT-2's pre-LN blocks (Radford et al. 2019) without attention: h1 = LayerNorm(h) W1^T + b1 + h, then
    # h2 = gelu_tanh(LayerNorm(h1) W2^T + b2) W3^T + b3 + h1, and a final LayerNorm. Each residual sum is read by
    # the next LayerNorm and the next residual add; with ``sum_out`` the last block's h1 is a graph output too
    g = Graph()
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    params = {}

    def param(name, shape, scale=1.0):
        params[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
        return g.parameter(name, list(shape))

    h = g.input("x", [m, n])
    outs = []
    for i in range(layers):
        a = g.layer_norm(h, param(f"g1_{i}", (n,)), param(f"c1_{i}", (n,)))
        h1 = g.add(g.bias_add(g.matmul_bt(a, param(f"w1_{i}", (n, n), n ** -0.5)), param(f"b1_{i}", (n,))), h)
        c = g.layer_norm(h1, param(f"g2_{i}", (n,)), param(f"c2_{i}", (n,)))
        f = g.add_node("GeluTanh", (g.bias_add(g.matmul_bt(c, param(f"w2_{i}", (k, n), n ** -0.5)),
                                               param(f"b2_{i}", (k,))),))
        h = g.add(g.bias_add(g.matmul_bt(f, param(f"w3_{i}", (n, k), k ** -0.5)), param(f"b3_{i}", (n,))), h1)
        outs = [h1] if sum_out else []
    g.set_outputs([g.layer_norm(h, param("gf", (n,)), param("cf", (n,))), *outs])
    return g, {"x": rng.standard_normal((m, n)).astype(np.float32)}, params


@pytest.mark.parametrize("m, k, n, sum_out", [(16, 40, 48, False), (5, 24, 64, True), (64, 9, 4, False),
                                               (5, 24, 45, False)])
def test_layer_norm_pair_rule_on_pre_ln_blocks(m, k, n, sum_out, device):
    # each residual sum read by a LayerNorm and a residual add is stored with its LayerNorm by one product
    # (FusedMatMulLayerNormPair) and read through Select views at offsets 0 and M N; parts of a multiple of 256
    # bytes only (5 x 45 f32 are 900: no pair, the LayerNorms stay). Residual sums as a graph output read back
    # through their window; 16 x 48, 5 x 64 (odd M), 64 x 4 (N of one quad)
    g, feeds, params = _pre_ln_blocks(m, k, n, 2, sum_out)
    opt, _ = run_optimised(g, device, feeds, params)
    ops = [node.op for node in opt.live_nodes()]
    aligned = m * n % 64 == 0
    # the last sum is read by the final LayerNorm alone: FusedMatMulLayerNorm, which stores half as much
    assert ops.count("FusedMatMulLayerNormPair") == (3 if aligned else 0), ops
    assert ops.count("Select") == (6 if aligned else 0), ops
    assert ops.count("FusedMatMulLayerNorm") == 1, ops
    assert ops.count("LayerNorm") == (1 if aligned else 4), ops  # the first block's, of the input
    if aligned:
        plan = lower(opt, dict(device.limits))
        windows = [b for b in plan.buffers if b.kind == "window"]
        assert {b.window[1] for b in windows} == {0, m * n * 4}, windows
        assert not set(plan.storage) & {b.window[0] for b in windows if b.index in plan.outputs}


def _pooled_embedding(b: int, s: int, n: int, pooled_out: bool) -> tuple[Graph, dict, dict]:
    # a sentence embedding's tail: each sequence's token rows averaged (a [B, B*S] pooling matrix of the
    # mask over the token counts) and L2-normalised (RmsNorm with weight 1/sqrt(N): x / |x|)
    g = Graph()
    h = g.input("h", [b * s, n])
    pooled = g.matmul(g.input("pool", [b, b * s]), h)
    g.set_outputs([g.rms_norm(pooled, g.parameter("w_norm", [n]), eps=1e-24 / n)] + ([pooled] if pooled_out else []))
    rng = np.random.default_rng(b * 100 + n)
    mask = (rng.random((b, s)) < 0.8).astype(np.float32)
    mask[:, 0] = 1.0
    pool = np.zeros((b, b * s), np.float32)
    for i in range(b):
        pool[i, i * s:(i + 1) * s] = mask[i] / mask[i].sum()
    feeds = {"h": rng.standard_normal((b * s, n)).astype(np.float32), "pool": pool}
    return g, feeds, {"w_norm": np.full(n, 1 / np.sqrt(n), np.float32)}


@pytest.mark.parametrize("b, s, n", [(8, 128, 384), (3, 7, 45)])
def test_rms_norm_rule_on_pooled_embeddings(b, s, n, device):
    g, feeds, params = _pooled_embedding(b, s, n, pooled_out=False)
    opt, _ = run_optimised(g, device, feeds, params)
    ops = [n.op for n in opt.live_nodes()]
    assert ops.count("FusedMatMulRmsNorm") == 1 and "RmsNorm" not in ops, ops


@pytest.mark.parametrize("weight", [True, False])
def test_rms_norm_rule_on_a_linear_layer(weight, device):
    # x @ W^T + b, then RmsNorm: fused with the bias in the product's epilogue; an RmsNorm without a weight
    # has no fused form and stays a dispatch of its own
    g = Graph()
    h = g.bias_add(g.matmul_bt(g.input("x", [37, 40]), g.parameter("w", [45, 40])), g.parameter("b", [45]))
    g.set_outputs([g.rms_norm(h, g.parameter("w_norm", [45]), eps=1e-5) if weight
                   else g.add_node("RmsNorm", (h,), eps=1e-5)])
    rng = np.random.default_rng(5)
    params = {"w": rng.standard_normal((45, 40)).astype(np.float32), "b": rng.standard_normal(45).astype(np.float32),
              "w_norm": rng.standard_normal(45).astype(np.float32)}
    opt, _ = run_optimised(g, device, {"x": rng.standard_normal((37, 40)).astype(np.float32)},
                           {k: v for k, v in params.items() if weight or k != "w_norm"})
    fused = [n for n in opt.live_nodes() if n.op == "FusedMatMulRmsNorm"]
    assert len(fused) == int(weight) and ("RmsNorm" in [n.op for n in opt.live_nodes()]) == (not weight)
    assert all(n.attrs["variant"] == "BT" and n.attrs["epilogue"] == ("bias",) for n in fused)


def test_rms_norm_rule_leaves_a_stored_product(device):
    # the pooled rows are a graph output too: stored anyway, so the norm reads them
    g, feeds, params = _pooled_embedding(3, 7, 45, pooled_out=True)
    opt, _ = run_optimised(g, device, feeds, params)
    assert not any(n.op == "FusedMatMulRmsNorm" for n in opt.live_nodes())


def _llama_mlp(m: int, d: int, f: int, gate_out: bool) -> tuple[Graph, dict, dict]:
    g = Graph()
    x = g.input("x", [m, d])
    h = g.rms_norm(x, g.parameter("w_norm", [d]))
    gate = g.matmul_bt(h, g.parameter("wg", [f, d]))
    up = g.matmul_bt(h, g.parameter("wu", [f, d]))
    act = g.swiglu(gate, up)
    out = g.add(g.matmul_bt(act, g.parameter("wd", [d, f])), x)
    g.set_outputs([out, gate] if gate_out else [out])
    rng = np.random.default_rng(m * 7 + f)
    feeds = {"x": rng.standard_normal((m, d)).astype(np.float32)}
    params = {name: (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
              for name, shape in (("w_norm", (d,)), ("wg", (f, d)), ("wu", (f, d)), ("wd", (d, f)))}
    return g, feeds, params


@pytest.mark.parametrize("m, gate_out", [(37, False), (6, True), (5, False), (4, False)])  # GEMV_MAX_ROWS 4
def test_swiglu_rule_on_a_llama_mlp(m, gate_out, device):
    g, feeds, params = _llama_mlp(m, 48, 70, gate_out)
    opt, _ = run_optimised(g, device, feeds, params)
    ops = [n.op for n in opt.live_nodes()]
    if gate_out:  # the gate is stored: the projections stay apart, and the numbers right
        assert "FusedRmsNormMatMulSwiGLU" not in ops, ops
    elif m > 4:  # the gated product; a decode-sized one takes SwiGLU in the down projection's prologue
        assert ops.count("FusedRmsNormMatMulSwiGLU") == 1, ops
    else:
        assert "FusedRmsNormMatMulSwiGLU" not in ops and "FusedSwiGLUMatMul" in ops, ops


def test_a_product_whose_chain_has_a_region_keeps_its_gate_apart(device):
    # Mul by a broadcast row joins the product's store as a generated region (Epi.ex over [M, N]): the
    # final-step ops take none (epilogue_without_region), so SwiGLUConcat stays a dispatch of its own;
    # the numbers hold after one optimisation and after a second one of the optimised graph
    from eggfuse.ir import evaluate
    from eggfuse.ir.ops.fused_epilogue import is_expr
    from eggfuse.lowering import lower
    from eggfuse.rewrites import optimize
    from eggfuse.runtime import Session

    g = Graph()
    prod = g.matmul(g.input("x", [6, 8]), g.parameter("w", [8, 10]))
    g.set_outputs([g.swiglu_concat(g.mul(prod, g.parameter("s", [10])))])
    once, _ = optimize(g)
    ops = {n.op: n for n in once.live_nodes()}
    assert "FusedMatMulSwiGLU" not in ops and "SwiGLUConcat" in ops, sorted(ops)
    assert any(is_expr(step) for step in ops["FusedMatMul"].attrs["epilogue"])
    twice, _ = optimize(once)
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((6, 8)).astype(np.float32)}
    params = {"w": rng.standard_normal((8, 10)).astype(np.float32), "s": rng.standard_normal(10).astype(np.float32)}
    (want,) = evaluate(g, feeds, params)
    for opt in (once, twice):
        (got,) = Session(lower(opt, dict(device.limits)), params, device=device).run(feeds)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
