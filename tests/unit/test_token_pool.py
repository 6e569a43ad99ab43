"""TokenPool's recognition (ir/ops/token_pool.py) on graphs built by hand: the exporters' chains
with scalar Clip bounds become one TokenPool, and the same chains with a bound of a higher rank
(one element that broadcasts the result to [1, B, H]) are left alone. The exported fixtures
(tests/data/exported/bert_tiny_pooled.*) and the rules' soundness examples cover the rest."""

from __future__ import annotations

import numpy as np
import pytest

from eggfuse.ir import DType, Graph, evaluate
from eggfuse.rewrites import optimize

B, S, H = 2, 3, 4


def _bound(g: Graph, value: float, shape) -> int:
    return g.constant(np.full(shape, value, np.float32), shape=shape)


def _pooled(lo_shape=(), hi_shape=(), norm_shape=None, expand=True) -> Graph:
    # sentence-transformers' mean over an i32 mask, then (norm_shape given) torch's normalize, as exporters write them
    g = Graph()
    x, m = g.input("x", [B, S, H]), g.input("m", [B, S], DType.I32)
    full = g.add_node("Cast", (g.add_node("Expand", (g.reshape(m, [B, S, 1]),), shape=[B, S, H]),), to="f32")
    total = g.add_node("ReduceSum", (g.add_node("Mul", (x, full)),), axes=[1], keepdims=False)
    count = g.add_node("ReduceSum", (full,), axes=[1], keepdims=False)
    out = g.add_node("Div", (total, g.add_node("Clip", (count, _bound(g, 1e-9, lo_shape),
                                                             _bound(g, np.inf, hi_shape)))))
    if norm_shape is not None:
        norm = g.add_node("Clip", (g.add_node("ReduceL2", (out,), axes=[1], keepdims=True),
                                   _bound(g, 1e-12, norm_shape), _bound(g, np.inf, ())))
        out = g.add_node("Div", (out, g.add_node("Expand", (norm,), shape=[B, H]) if expand else norm))
    g.set_outputs([out])
    return g


def _check(g: Graph) -> dict[str, int]:
    opt, _ = optimize(g, verify=True)
    feeds = {"x": np.random.default_rng(0).standard_normal((B, S, H)).astype(np.float32),
             "m": np.array([[1, 1, 0], [0, 0, 0]], np.int32)}
    np.testing.assert_allclose(evaluate(opt, feeds, {})[0], evaluate(g, feeds, {})[0], rtol=1e-12, atol=1e-15)
    ops = [n.op for n in opt.live_nodes()]
    return {op: ops.count(op) for op in set(ops)}


@pytest.mark.parametrize("expand", [True, False])
def test_mean_and_normalize_become_one_token_pool(expand):
    ops = _check(_pooled(norm_shape=(), expand=expand))
    assert ops.get("TokenPool") == 1 and not ops.get("ReduceSum") and not ops.get("ReduceL2"), ops


@pytest.mark.parametrize("lo_shape, hi_shape", [((1, 1, 1), ()), ((), (1, 1, 1))])
def test_a_count_bound_of_higher_rank_keeps_the_chain(lo_shape, hi_shape):
    # Clip(count [B, H], lo [1, 1, 1]) is [1, B, H]: the Div is no [B, H] TokenPool
    g = _pooled(lo_shape, hi_shape)
    assert g.node(g.outputs[0]).type.shape == (1, B, H)
    assert "TokenPool" not in _check(g)


@pytest.mark.parametrize("expand", [True, False])
def test_a_norm_bound_of_higher_rank_keeps_the_normalisation(expand):
    ops = _check(_pooled(norm_shape=(1, 1, 1), expand=expand))
    assert ops.get("TokenPool") == 1 and ops.get("ReduceL2") == 1, ops  # the mean alone
