"""Autodiff gradients computed on the GPU, one row per differentiable op.

The rows are those of ``tests/unit/test_autodiff.py``, where ``ir.evaluate`` of each
training graph is checked against central finite differences. Here the same training
graph runs through lowering and a :class:`Session` (f32 kernels) and must match
``ir.evaluate`` (float64) to 1e-4 of each output's largest magnitude: together, GPU
gradients match finite differences of the numpy reference.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from unit.test_autodiff import ROWS, Row, _loss, leaf_values, split

from eggfuse.ir import Graph, evaluate
from eggfuse.ir.autodiff import grad
from eggfuse.pipeline import lower_for
from eggfuse.runtime import Session


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_gpu_gradients_match_reference(row: Row, device):
    rng = np.random.default_rng(zlib.crc32(row.id.encode()))
    g = Graph()
    loss = _loss(g, row.build(g), rng)
    values = leaf_values(g, row, rng)
    tg = grad(g, loss)
    inputs, params = split(g, values)
    want = evaluate(tg, inputs, params)
    live = tg.live_nodes()
    used = {n.attrs["name"] for n in live if n.op in ("Input", "Parameter")}
    got = Session(lower_for(tg, device), {k: v for k, v in params.items() if k in used}, device=device).run(
        {k: v for k, v in inputs.items() if k in used})
    for name, a, b in zip(["loss", *tg.grad_outputs], got, want, strict=True):
        assert a.shape == b.shape and np.isfinite(a).all(), name
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * max(float(np.abs(b).max()), 1e-3),
                                   err_msg=f"{row.id}: d loss / d {name}")
