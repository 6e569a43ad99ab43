"""Subgroup forms of the reductions: the device probe, lowering's include swap, and refusals."""

import numpy as np
import pytest

from eggfuse.ir import Graph, InputError, LoweringError, evaluate
from eggfuse.lowering import lower
from eggfuse.lowering.wgsl import render, subgroups
from eggfuse.pipeline import lower_for
from eggfuse.runtime import Session
from eggfuse.runtime import device as device_module
from eggfuse.runtime import session as session_module


def _softmax() -> Graph:
    g = Graph()
    g.set_outputs([g.add_node("Softmax", (g.input("x", [3, 300]),))])
    return g


def test_render_swaps_includes_only_inside_the_block():
    plain = render("softmax.wgsl", NORM="1.0 / total", OUT="exp(z) * norm")
    with subgroups(True):
        sg = render("softmax.wgsl", NORM="1.0 / total", OUT="exp(z) * norm")
    assert "subgroupAdd" not in plain and "var<workgroup> red: array<f32, 256>" in plain
    assert "subgroupAdd" in sg and "subgroupMax" in sg and "var<workgroup> red:" not in sg
    assert "subgroupAdd" not in render("softmax.wgsl", NORM="1.0 / total", OUT="exp(z) * norm")


def test_lowering_marks_subgroup_kernels():
    plan = lower(_softmax(), subgroups=True)
    assert plan.subgroups and [d.kernel for d in plan.dispatches] == ["softmax+sg"]
    plain = lower(_softmax())
    assert not plain.subgroups and [d.kernel for d in plain.dispatches] == ["softmax"]
    # an op without a subgroup form lowers the same either way
    g = Graph()
    g.set_outputs([g.relu(g.input("x", [5]))])
    assert not lower(g, subgroups=True).subgroups


def test_probe_agrees_with_the_feature(device):
    usable = device_module.subgroup_reductions_usable(device)
    if "subgroup" not in device.features:
        assert not usable
    s = Session(lower_for(_softmax(), device), {}, device=device)
    assert s.plan.subgroups == usable
    x = np.random.default_rng(0).standard_normal((3, 300)).astype(np.float32)
    np.testing.assert_allclose(s.run({"x": x})[0], evaluate(_softmax(), {"x": x}, {})[0], rtol=1e-5, atol=1e-7)


def test_environment_variable_turns_subgroups_off(device, monkeypatch):
    monkeypatch.setenv("EGGFUSE_SUBGROUPS", "0")
    assert not device_module.subgroup_reductions_usable(device)
    assert not Session(lower_for(_softmax(), device), {}, device=device).plan.subgroups


def test_subgroups_refused_where_the_device_lacks_them(device, monkeypatch):
    monkeypatch.setattr(session_module, "subgroup_reductions_usable", lambda d: False)  # Session's check
    monkeypatch.setattr(device_module, "subgroup_reductions_usable", lambda d: False)  # lower_for's
    with pytest.raises(InputError, match="subgroups=True"):
        Session(lower_for(_softmax(), device, subgroups=True), {}, device=device)
    with pytest.raises(LoweringError, match="subgroup operations"):
        Session(lower(_softmax(), dict(device.limits), subgroups=True), {}, device=device)
    assert not Session(lower_for(_softmax(), device), {}, device=device).plan.subgroups


@pytest.mark.parametrize("bad", [1, "yes", 0])
def test_subgroups_argument_must_be_none_or_a_bool(bad, device):
    with pytest.raises(InputError, match="subgroups must be None, True or False"):
        Session(lower_for(_softmax(), device, subgroups=bad), {}, device=device)
