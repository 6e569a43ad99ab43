"""The GPU op table's row type and check, shared by ``tests/gpu/test_ops*.py``.

A :class:`Row` builds one op into a graph whose leaves are random (inputs and parameters
alike: floats N(0, scale), i32 in [-9, 9], bools, u32 indices below the tables they index),
optionally with hand-made feeds; :func:`check_row` runs it on the device and compares it with
the numpy reference (``eggfuse.ir.evaluate``): floats within ``rtol``/``atol``, integers and
bools exactly.
"""

from __future__ import annotations

import importlib.util
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from eggfuse.ir import DType, Graph, evaluate
from eggfuse.lowering import lower
from eggfuse.pipeline import lower_for
from eggfuse.runtime import Session

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Row:
    op: str
    id: str
    build: Callable[[Graph], int]
    feeds: dict[str, np.ndarray] = field(default_factory=dict)
    scale: float = 1.0  # spread of the random float leaves
    rtol: float = 1e-4
    atol: float | None = None  # default: 1e-5 * max(1, max |reference|)
    finite: bool = True  # False: feeds and reference may hold NaN / infinities, which the kernel must match


def random_leaves(g: Graph, row: Row, rng: np.random.Generator, device) -> tuple[dict, dict]:
    plan = lower(g, dict(device.limits))
    bounds = plan.index_bounds
    inputs, params = {}, {}
    for leaves, out in ((g.inputs, inputs), (g.parameters, params)):
        for name, ty in leaves.items():
            if name in row.feeds:
                out[name] = row.feeds[name]
            elif ty.dtype is DType.U32:
                out[name] = rng.integers(0, bounds.get(name, 10), size=ty.shape)
            elif ty.dtype is DType.I32:  # indices within the axes they index (from the end too), as ONNX requires
                low, high = (-bounds[name], bounds[name]) if name in bounds else (-9, 10)
                values = rng.integers(low, high, size=ty.shape).astype(np.int32)
                for part in plan.index_parts.get(name, ()):
                    values.reshape(-1)[part.positions] = rng.integers(-part.rows, part.rows, size=len(part.positions))
                out[name] = values
            elif ty.dtype is DType.BOOL:
                out[name] = rng.integers(0, 2, size=ty.shape).astype(bool)
            else:
                out[name] = (row.scale * rng.standard_normal(ty.shape)).astype(np.float32)
    return inputs, params


def check_row(row: Row, device, subgroups: bool | None) -> Session:
    g = Graph()
    g.set_outputs([row.build(g)])
    rng = np.random.default_rng(zlib.crc32(row.id.encode()))
    inputs, params = random_leaves(g, row, rng, device)
    session = Session(lower_for(g, device, subgroups=subgroups), params, device=device, finite_inputs=row.finite)
    (got,) = session.run(inputs)
    (want,) = evaluate(g, inputs, params, check_finite=row.finite)
    ty = g.node(g.outputs[0]).type
    assert got.shape == want.shape and got.dtype == ty.dtype.numpy, (got.shape, got.dtype, ty)
    if ty.dtype is not DType.F32:
        np.testing.assert_array_equal(got, want.astype(ty.dtype.numpy))
        return session
    assert np.isfinite(got).all() or not row.finite
    finite = want[np.isfinite(want)]
    atol = row.atol if row.atol is not None else 1e-5 * max(1.0, float(np.abs(finite).max()) if finite.size else 1.0)
    np.testing.assert_allclose(got, want, rtol=row.rtol, atol=atol)
    return session


def run_optimised(g: Graph, device, feeds: dict, params: dict, rulesets=None) -> tuple[Graph, list[np.ndarray]]:
    """``g`` optimised by the rewrite engine (``rulesets``: None, the default ones) and run on the device, its
    outputs checked against the unfused graph's numpy reference (relative 1e-4, absolute 1e-5 of each output's
    scale); returns the optimised graph and the outputs."""
    from eggfuse.rewrites import optimize

    opt, _ = optimize(g, rulesets=rulesets)
    got = Session(lower(opt, dict(device.limits)), params, device=device).run(feeds)
    want = evaluate(g, feeds, params)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(b).max())))
    return opt, got


def row_modules() -> list:
    """Every ``tests/gpu/test_ops*.py`` module, loaded by path (no GPU needed to list rows)."""
    out = []
    for path in sorted((REPO / "tests" / "gpu").glob("test_ops*.py")):
        name = f"_gpu_op_rows_{path.stem}"
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # dataclasses look their module up there
            spec.loader.exec_module(module)
        out.append(sys.modules[name])
    return out


def all_rows() -> list[Row]:
    """The rows of every GPU op table module."""
    return [row for m in row_modules() for row in getattr(m, "ROWS", ())]
