"""Kernels reading their uniform parameters as a WGSL module constant (``lower(..., constant_params=True)``,
``Kernel.constant_params``, ``lowering.wgsl.binding_header``): every kernel of the GPU op table compiles in
that form, the hand-built models' ops compute what they compute with the uniform, ``lower_for`` takes the
form on GPUs only, and the runtime compiles the uniform form where the constant one does not compile
(``runtime.pipelines``, ``lowering.wgsl.uniform_form``)."""

from __future__ import annotations

import importlib
import logging
from pathlib import Path

import numpy as np
import pytest
from every_op import every_op_graph  # tests/every_op.py
from op_table import check_row  # tests/op_table.py

from eggfuse import pipeline
from eggfuse.ir import DeviceError, Graph, InputError, evaluate
from eggfuse.lowering import lower
from eggfuse.pipeline import lower_for
from eggfuse.rewrites import random_feeds
from eggfuse.runtime import Session
from eggfuse.runtime import pipelines as pipeline_cache

CONSTANT = "const p = Params("


def _op_table_rows():
    # every row of tests/gpu/test_ops*.py
    rows = []
    for path in sorted(Path(__file__).parent.glob("test_ops*.py")):
        rows += importlib.import_module(path.stem).ROWS
    return rows


def test_every_op_table_kernel_compiles_with_its_parameters_as_constants(device):
    # naga evaluates a constant expression when the module is created: a kernel whose sizes make one fail (a
    # division by 0, a float past f32) would compile only in the uniform form; none of the op table's does
    seen, failed = set(), []
    for row in _op_table_rows():
        g = Graph()
        g.set_outputs([row.build(g)])
        for d in lower(g, dict(device.limits), constant_params=True).dispatches:
            if CONSTANT not in d.source or d.source in seen:
                continue
            seen.add(d.source)
            try:
                device.create_shader_module(code=d.source, label=d.kernel)
            except Exception as e:  # noqa: BLE001 - listed below
                failed.append(f"{row.id}: {d.kernel}: {str(e).splitlines()[0]}")
    assert len(seen) > 1000 and not failed, failed[:10]


def test_the_hand_built_ops_compute_the_same_with_constants(device):
    g = every_op_graph()
    inputs, params = random_feeds(g, seed=5)
    plans = {c: lower_for(g, device, constant_params=c) for c in (True, False)}
    assert sum(CONSTANT in d.source for d in plans[True].dispatches) > len(plans[True].dispatches) // 2
    assert not any(CONSTANT in d.source for d in plans[False].dispatches)
    got = {c: Session(plan, params, device=device).run(inputs) for c, plan in plans.items()}
    want = evaluate(g, inputs, params)
    for a, b, w in zip(got[True], got[False], want, strict=True):
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6 * scale)  # a driver may fold a constant differently
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-5 * scale)


def test_a_sample_of_the_op_table_computes_its_reference_with_constants(device, monkeypatch):
    # one row in 16 of tests/gpu/test_ops*.py run as a GPU runs them (pipeline.CONSTANT_PARAMS forces the form here)
    monkeypatch.setattr(pipeline, "CONSTANT_PARAMS", True)
    rows = _op_table_rows()[::16]
    constant = 0
    for row in rows:  # check_row compares with the numpy reference
        session = check_row(row, device, subgroups=None)
        constant += any(CONSTANT in d.source for d in session.plan.dispatches)
    # the others have no parameters, or ones a constant cannot hold (vec4 arrays of strides: the uniform)
    assert len(rows) > 100 and constant > len(rows) // 2, (constant, len(rows))


def test_lower_for_takes_the_constants_on_a_gpu_only(device, monkeypatch):
    # on a CPU adapter (lavapipe) a pipeline per size costs a compilation that a run or two does not win back
    g = Graph()
    g.set_outputs([g.relu(g.matmul_bt(g.input("x", [128, 96]), g.parameter("w", [192, 96])))])
    cpu = device.adapter.info.get("adapter_type") == "CPU"
    assert (CONSTANT in lower_for(g, device).dispatches[0].source) == (not cpu)
    with pytest.raises(InputError, match="constant_params must be None, True or False, got 'yes'"):
        lower_for(g, device, constant_params="yes")
    with pytest.raises(InputError, match="constant_params must be True or False, got 'yes'"):
        lower(g, constant_params="yes")
    # the module's switch, for timing the form either way on any adapter
    for forced in (True, False):
        monkeypatch.setattr(pipeline, "CONSTANT_PARAMS", forced)
        assert (CONSTANT in lower_for(g, device).dispatches[0].source) == forced


_DIVIDES_BY_N = """@group(0) @binding(0) var<storage, read_write> out: array<u32>;
struct Params {
    n: u32,
}
@group(0) @binding(1) var<uniform> p_bound: Params;
const p = Params(0u);

@compute @workgroup_size(1)
fn main() {
    out[0] = 7u / p.n;
}
"""


def test_a_constant_form_that_does_not_compile_is_compiled_reading_the_uniform(device, caplog):
    # 7u / 0u is an error as a constant expression and defined at run time (WGSL: e1 / 0 is e1)
    with pytest.raises(Exception, match="Validation Error"):
        device.create_shader_module(code=_DIVIDES_BY_N)
    with caplog.at_level(logging.INFO, logger="eggfuse.runtime"):
        pipeline, _ = pipeline_cache.get_pipeline(device, _DIVIDES_BY_N, "main", 1, True, label="divides_by_n")
    assert pipeline is not None and "divides_by_n: its parameters as constants do not compile" in caplog.text
    broken = _DIVIDES_BY_N.replace("const p = Params(0u);", "const p = Params(0u);\nfn {")
    with pytest.raises(DeviceError, match="compiling kernel for broken"):
        pipeline_cache.get_pipeline(device, broken, "main", 1, True, label="broken")
