"""The MatMul, Gemm and Einsum converters (eggfuse/onnx/ops/linalg.py) against onnxruntime:
numpy-matmul shapes, every Gemm attribute and bias shape over the opset variants, batched-matmul
and generic einsum equations, and the graphs they become (a weight MatMul stays the fusable 2-D
MatMul)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_models import I64, F, model, node  # tests/onnx_models.py
from onnx_ort_check import check_against_ort, plan_ops  # tests/onnx_ort_check.py

from eggfuse.ir import OnnxError
from eggfuse.onnx import load

RNG = np.random.default_rng(11)


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("sa,sb", [([3, 4], [4, 5]), ([2, 3, 4], [4, 5]), ([4], [4, 5]), ([2, 3, 4], [4]),
                                   ([3], [3]), ([4], [2, 4, 1]), ([2, 3, 4], [2, 4, 3]), ([3, 1, 3, 4], [1, 2, 4, 2]),
                                   ([5, 7], [3, 7, 2]), ([1, 2, 4, 3], [3])])
def test_matmul_shapes(sa, sb, device):
    m = model([node("MatMul", ["a", "b"], ["y"])], [("a", F, sa), ("b", F, sb)], [("y", F, None)], opset=13)
    check_against_ort(m, {"a": _f(*sa), "b": _f(*sb)}, device=device)


def test_matmul_by_a_weight_is_a_2d_matmul_whose_bias_residual_and_activation_fuse(device):
    # the elementwise converters (another family) add a bias, a residual and an activation to
    # the [2, 5, 24] result; here the same IR ops are added to the imported graph
    import eggfuse

    w, b = _f(16, 24), _f(24)
    m = model([node("MatMul", ["x", "w"], ["h"])], [("x", F, [2, 5, 16])], [("h", F, None)], [("w", w)], opset=13)
    g, params = load(m)
    assert [n.op for n in g.nodes if n.op not in ("Input", "Parameter")] == ["Identity", "MatMul", "Identity"]
    params["b"] = b
    y = g.relu(g.add(g.input("r", [2, 5, 24]), g.add(g.outputs[0], g.parameter("b", [24]))))
    g.set_outputs([y])
    compiled = eggfuse.compile(g, params, device=device)
    assert [d.op for d in compiled.plan.dispatches] == ["FusedMatMul"]  # bias, residual and Relu in its store
    x, r = _f(2, 5, 16), _f(2, 5, 24)
    (got,) = compiled.run({"x": x, "r": r})
    np.testing.assert_allclose(got, np.maximum(x @ w + b + r, 0), rtol=1e-4, atol=1e-5)


_GEMMS = [(1, 0, 1.0, 1.0, [5]), (0, 1, 0.5, 1.0, [1, 5]), (1, 1, 1.0, 2.0, [3, 5]), (0, 0, 2.0, 0.5, []),
          (0, 1, 1.0, 1.0, [1]), (1, 0, 1.5, -1.0, [3, 1]), (0, 0, 1.0, 0.0, [3, 5])]


@pytest.mark.parametrize("opset,ta,tb,alpha,beta,c", [(o, *g) for o in (7, 11, 13) for g in _GEMMS]
                         + [(o, 0, 0, 1.0, 1.0, None) for o in (11, 13)])  # C is optional from opset 11
def test_gemm_attributes_and_bias_shapes(opset, ta, tb, alpha, beta, c, device):
    a_shape, b_shape = ([4, 3] if ta else [3, 4]), ([5, 4] if tb else [4, 5])
    inputs = [("a", F, a_shape), ("b", F, b_shape)]
    inits = [] if c is None else [("c", _f(*c))]
    gemm = node("Gemm", ["a", "b"] + ([] if c is None else ["c"]), ["y"], transA=ta, transB=tb, alpha=alpha, beta=beta)
    m = model([gemm], inputs, [("y", F, None)], inits, opset=opset)
    check_against_ort(m, {"a": _f(*a_shape), "b": _f(*b_shape)}, device=device)


def test_gemm_with_a_runtime_bias_fuses_into_the_matmul(device):
    m = model([node("Gemm", ["a", "w", "c"], ["y"], transB=1, alpha=0.5)], [("a", F, [6, 8]), ("c", F, [7])],
              [("y", F, None)], [("w", _f(7, 8))], opset=13)
    eg = check_against_ort(m, {"a": _f(6, 8), "c": _f(7)}, device=device)
    (spec,) = eg.plans.values()
    assert [d.op for d in spec.compiled.plan.dispatches] == ["FusedMatMul"]


@pytest.mark.parametrize("equation,shapes,op", [
    ("bij,bjk->bik", [[5, 2, 3], [5, 3, 4]], "BatchMatMul"),
    ("bhqd,bhkd->bhqk", [[2, 3, 5, 8], [2, 3, 7, 8]], "BatchMatMul"),
    ("bhqk,bhkd->bhqd", [[2, 3, 5, 7], [2, 3, 7, 8]], "BatchMatMul"),
    ("ij,jk->ik", [[3, 4], [4, 5]], "MatMul"),
    ("ij,kj->ik", [[3, 4], [5, 4]], "MatMulBT"),
    ("ji,jk->ik", [[4, 3], [4, 5]], "MatMulAT"),
    ("ji,kj->ik", [[4, 3], [5, 4]], "BatchMatMul"),
    ("ik,kj->ji", [[3, 4], [4, 5]], "BatchMatMul"),  # the output transposed: the operands swap, both transposed
    ("bnc,bcd->bnd", [[2, 6, 3], [2, 3, 4]], "BatchMatMul"),
    ("i,i", [[5], [5]], "BatchMatMul"),
    ("i,j->ij", [[3], [4]], "MatMul"),
    ("ij->ji", [[3, 4]], "Transpose"),
    ("bii->bi", [[3, 5, 5]], "Einsum"),
    ("ij->i", [[3, 4]], "Einsum"),
    ("...ij,...jk->...ik", [[2, 1, 3, 4], [1, 5, 4, 2]], "Einsum"),  # broadcast batch: the generic kernel
    ("...ij,...jk->...ik", [[2, 3, 3, 4], [2, 3, 4, 2]], "BatchMatMul"),
    ("ij,jk,kl->il", [[2, 3], [3, 4], [4, 5]], "Einsum"),
    ("abc->cab", [[2, 3, 4]], "Einsum"),
])
def test_einsum_equations(equation, shapes, op, device):
    names = [f"x{i}" for i in range(len(shapes))]
    m = model([node("Einsum", names, ["y"], equation=equation)],
              [(n, F, s) for n, s in zip(names, shapes, strict=True)], [("y", F, None)], opset=12)
    eg = check_against_ort(m, {n: _f(*s) for n, s in zip(names, shapes, strict=True)}, device=device)
    assert op in plan_ops(eg), plan_ops(eg)


def test_refusals_name_the_node_and_say_what_to_do():
    m = model([node("MatMul", ["a", "b"], ["y"], name="mm")], [("a", I64, [2, 3]), ("b", I64, [3, 2])],
              [("y", I64, None)], opset=13)
    with pytest.raises(OnnxError, match=r"MatMul node 'mm': input 0 .* INT64; eggfuse runs MatMul in float32"):
        load(m)
    four = model([node("Einsum", ["a", "a", "a", "a"], ["y"], name="e4", equation="i,i,i,i->")], [("a", F, [3])],
                 [("y", F, None)], opset=12)
    with pytest.raises(OnnxError, match=r"Einsum node 'e4': .* 4 operands; .* 1 to 3"):
        load(four)
    bad = model([node("Einsum", ["a", "b"], ["y"], name="e2", equation="ij,jk->ik")],
                [("a", F, [2, 3]), ("b", F, [4, 5])], [("y", F, None)], opset=12)
    with pytest.raises(OnnxError, match=r"Einsum node 'e2': .*letter 'j' has sizes 3 and 4"):
        load(bad)
    gemm = model([node("Gemm", ["a", "b"], ["y"], name="g")], [("a", F, [2, 3, 4]), ("b", F, [4, 2])],
                 [("y", F, None)], opset=13)
    with pytest.raises(OnnxError, match=r"Gemm node 'g': Gemm takes 2-D A and B"):
        load(gemm)


# --- weights over one binding (VGG's fc6 is 4096 x 25088 floats, 411 MB): split into blocks ---


@pytest.mark.parametrize("opset,ta,tb,alpha,beta,c", [(13, *g) for g in _GEMMS] + [(13, 0, 1, 1.0, 1.0, None)])
def test_a_gemm_weight_over_the_binding_limit_runs_in_blocks(opset, ta, tb, alpha, beta, c, device, monkeypatch):
    from eggfuse.onnx.ops import linalg

    monkeypatch.setattr(linalg, "WEIGHT_BINDING_BYTES", 2 * 4 * 4)  # two lines of K = 4 floats a block
    a_shape, b_shape = ([4, 3] if ta else [3, 4]), ([5, 4] if tb else [4, 5])
    inits = [("b", _f(*b_shape))] + ([] if c is None else [("c", _f(*c))])
    gemm = node("Gemm", ["a", "b"] + ([] if c is None else ["c"]), ["y"], transA=ta, transB=tb, alpha=alpha, beta=beta)
    m = model([gemm], [("a", F, a_shape)], [("y", F, None)], inits, opset=opset)
    eg = check_against_ort(m, {"a": _f(*a_shape)}, device=device)
    (spec,) = eg.plans.values()
    ops = plan_ops(eg)
    assert ops.count("Concat") == 1 and sum(o.startswith("MatMul") for o in ops) == 3, ops  # N = 5: blocks 2, 2, 1
    # every block is a parameter named after the weight, whatever alpha (the product scaled at its store; alpha
    # folded into the weight made every block a constant of the graph); a [5] or [1, 5] bias is split with it
    blocks = {"b[0:2]", "b[2:4]", "b[4:5]"} if tb else {"b[:, 0:2]", "b[:, 2:4]", "b[:, 4:5]"}
    biases = {"c[0:2]", "c[2:4]", "c[4:5]"} if c in ([5], [1, 5]) and beta == 1.0 else set()
    kept = {"c"} if c is not None and not biases and beta != 0.0 else set()  # C added (or scaled) at run time
    # a block or bias of one element is a Constant, not a parameter (the importer bakes one-element floats)
    one = {"c[4:5]"} | ({"c"} if c is not None and int(np.prod(c)) == 1 else set())
    assert set(spec.params) == (blocks | biases | kept) - one, sorted(spec.params)


def test_a_matmul_weight_over_the_binding_limit_runs_in_column_blocks_that_fuse_their_epilogues(device, monkeypatch):
    from eggfuse.onnx.ops import linalg

    monkeypatch.setattr(linalg, "WEIGHT_BINDING_BYTES", 6 * 3 * 4)  # K = 6 rows of 3 columns a block
    m = model([node("MatMul", ["x", "w"], ["h"])], [("x", F, [2, 5, 6])], [("h", F, None)], [("w", _f(6, 8))],
              opset=13)
    eg = check_against_ort(m, {"x": _f(2, 5, 6)}, device=device)
    assert plan_ops(eg) == ["Identity", "MatMul", "MatMul", "MatMul", "Concat", "Identity"]
    (spec,) = eg.plans.values()
    assert [p.shape for p in spec.params.values()] == [(6, 3), (6, 3), (6, 2)]


def test_weight_blocks_are_even_and_a_weight_that_fits_is_not_split():
    from eggfuse.onnx.importer import Value
    from eggfuse.onnx.ops.linalg import WEIGHT_BINDING_BYTES, weight_blocks

    fc6 = Value("fc6_w_0", 1, (4096, 25088), const=np.zeros((1, 1), np.float32))  # the shape is what counts
    assert weight_blocks(fc6, 0) == [(0, 1024), (1024, 2048), (2048, 3072), (3072, 4096)]
    assert WEIGHT_BINDING_BYTES == 128 * 2**20
    fits = Value("w", 1, (4096, 8192), const=np.zeros((1, 1), np.float32))  # exactly 128 MiB
    assert weight_blocks(fits, 0) is None and weight_blocks(Value("x", 1, (4096, 25088)), 0) is None
    w = Value("w", 1, (10, 7), const=np.zeros((1, 1)))
    assert weight_blocks(w, 1, limit=3 * 10 * 4) == [(0, 3), (3, 6), (6, 7)]
