"""FusedSwiGLUMatMul (ir/ops/matmul.py): the down projection computes SwiGLUConcat's silu(gate) * up
as it loads its A operand, against the numpy reference of the unfused graph: chosen by the rewrite
for decode rows (the GEMV kernel, M <= 4), and built directly for the tiled kernel (M > 4, which the
rule leaves to SwiGLUConcat: SWIGLU_PROLOGUE_MAX_ROWS; 'BT' above 16 rows, as up to 16 may take the
GEMV); K a multiple of 4 (vec4 loads) and not, both weight layouts, an epilogue, a gated value that
is also a graph output."""

from __future__ import annotations

import numpy as np
import pytest

from eggfuse.ir import Graph, evaluate
from eggfuse.ir.ops.matmul import SWIGLU_PROLOGUE_MAX_ROWS
from eggfuse.pipeline import compile as compile_graph
from eggfuse.rewrites import optimize, random_feeds


def _down(m: int, k: int, n: int, variant: str, also_output: bool = False, fused: bool = False) -> Graph:
    g = Graph()
    x = g.input("x", [m, 2 * k])
    w = g.parameter("w", [n, k] if variant == "BT" else [k, n])
    if fused:  # the op itself, as the rewrite would build it
        r = g.input("r", [m, n])
        y = g.add_node("FusedSwiGLUMatMul", (x, w, r), variant=variant, epilogue=("add", "Tanh"))
        g.set_outputs([y])
        return g
    h = g.swiglu_concat(x)
    if variant == "BT":
        y = g.add(g.matmul_bt(h, w), g.input("r", [m, n]))
    else:
        y = g.relu(g.matmul(h, w))
    g.set_outputs([y, h] if also_output else [y])
    return g


def _check(g: Graph, compiled, inputs, params) -> None:
    got = compiled.run(inputs)
    for o, w in zip(got, evaluate(g, inputs, params), strict=True):
        np.testing.assert_allclose(o, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("m, k, n, variant", [(1, 8, 6, "BT"), (3, 13, 9, "BT"), (4, 5, 7, ""), (2, 12, 9, "")])
def test_the_gated_down_projection_of_decode_rows_is_one_kernel(m, k, n, variant, device):
    g = _down(m, k, n, variant)
    inputs, params = random_feeds(g, seed=5)
    compiled = compile_graph(g, params, device=device, cache=False)
    assert [d.kernel.split("_")[0] for d in compiled.plan.dispatches] == ["swiglu"], compiled.plan.dispatches
    _check(g, compiled, inputs, params)


@pytest.mark.parametrize("m, k, n, variant", [(17, 8, 6, "BT"), (7, 13, 9, ""), (33, 20, 70, "BT"), (65, 13, 33, "")])
def test_the_tiled_kernel_computes_the_gate_as_it_loads(m, k, n, variant, device):
    assert m > SWIGLU_PROLOGUE_MAX_ROWS
    g = _down(m, k, n, variant, fused=True)
    inputs, params = random_feeds(g, seed=7)
    compiled = compile_graph(g, params, device=device, fuse=False, cache=False)
    assert [d.kernel.split("_")[0] for d in compiled.plan.dispatches] == ["swiglu"], compiled.plan.dispatches
    _check(g, compiled, inputs, params)
    # the rewrite leaves more rows to SwiGLUConcat and the plain product
    opt, _ = optimize(_down(m, k, n, variant))
    assert "FusedSwiGLUMatMul" not in [x.op for x in opt.live_nodes()]


def test_a_gated_value_that_is_an_output_is_stored_and_right(device):
    g = _down(3, 12, 7, "BT", also_output=True)
    inputs, params = random_feeds(g, seed=6)
    _check(g, compile_graph(g, params, device=device, cache=False), inputs, params)


def test_smollm2_decode_takes_the_gated_product_and_prefill_does_not():
    from eggfuse.models.llama import LlamaConfig, build_llama_cache_graph, build_llama_graph

    config = LlamaConfig.smollm2_135m()
    decode, prefill = build_llama_cache_graph(config, 1, 64, layers=2), build_llama_graph(config, 16, layers=2)
    for graph, want in ((decode, 2), (prefill, 0)):
        out, rep = optimize(graph)
        ops = [n.op for n in out.live_nodes()]
        # prefill's gate/up product applies the gate in its second dispatch (ir/ops/matmul_rows.py)
        assert ops.count("FusedSwiGLUMatMul") == want and ops.count("SwiGLUConcat") == 0, rep.rules_fired
        assert ops.count("FusedRmsNormMatMulSwiGLU") == 2 - want, rep.rules_fired
