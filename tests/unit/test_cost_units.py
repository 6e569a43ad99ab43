"""Cost models in any unit: extraction neither rounds costs nor lets its tie-breaking units outweigh
them, so a model scaled by a constant extracts the same graph; and errors raised inside a cost model's
or a graph source's own code come out as eggfuse errors naming it."""

import numpy as np
import pytest

from eggfuse import cli
from eggfuse.api import model_graph
from eggfuse.graphs import graph_hash, load_graph
from eggfuse.ir import Graph, GraphError, InputError, RewriteError
from eggfuse.rewrites import CostModel, optimize
from eggfuse.rewrites.problem import MAX_SCALED_COST, cost_scale


def _scaled(factor: float) -> CostModel:
    class Scaled(CostModel):
        def kernel_cost(self, k):
            return super().kernel_cost(k) * factor

    return Scaled()


def _mlp() -> Graph:
    g = Graph()
    x = g.input("x", [8, 64])
    h = g.gelu(g.bias_add(g.matmul(x, g.parameter("w1", [64, 32])), g.parameter("b1", [32])))
    g.set_outputs([g.bias_add(g.matmul(h, g.parameter("w2", [32, 16])), g.parameter("b2", [16]))])
    return g


def _attention() -> Graph:
    g = Graph()
    x = g.input("x", [8, 16])
    q, k, v = (g.matmul(x, g.parameter(n, [16, 16])) for n in ("wq", "wk", "wv"))
    p = g.softmax(g.mul(g.matmul(q, g.transpose(k)), g.constant(0.25, [])))
    g.set_outputs([g.matmul(p, v)])
    return g


def _residual_norm() -> Graph:
    g = Graph()
    x = g.input("x", [8, 32])
    r = g.add(x, g.bias_add(g.matmul(x, g.parameter("w", [32, 32])), g.parameter("b", [32])))
    d = g.add_node("Sub", [r, g.add_node("ReduceMean", [r], axes=[1], keepdims=True)])
    var = g.add_node("ReduceMean", [g.mul(d, d)], axes=[1], keepdims=True)
    y = g.add_node("Div", [d, g.add_node("Sqrt", [g.add(var, g.constant(1e-5, []))])])
    g.set_outputs([g.add(g.mul(y, g.parameter("gamma", [32])), g.parameter("beta", [32]))])
    return g


GRAPHS = {"mlp": _mlp, "attention": _attention, "residual_norm": _residual_norm,
          "llama:1": lambda: model_graph("llama:1")}


@pytest.mark.parametrize("costs, scale", [
    ([512.0, 1e6], 1.0),  # the default model's bytes: left as they are
    ([0.0, 1.0, 2.0 ** 40], 1.0),  # both ends of the range
    ([5e-5, 0.1], 2.0 ** 15),  # 5e-5 * 2**15 = 1.6384
    ([4e-9, 1e-2], 2.0 ** 28),  # 4e-9 * 2**28 = 1.07
    ([0.5, 2.0 ** 41], 1.0),  # neither end can move without pushing the other out
    ([1e-3, 2.0 ** 38], 4.0),  # the largest caps the lift at 2**40
    ([3.0, 2.0 ** 41], 0.5),  # too large: brought down to 2**40
    ([512e7, 1e13], 2.0 ** -4),  # 1e13 / 16 = 6.25e11 <= 2**40 < 1e13 / 8
    ([1.5, 2.0 ** 45], 1.0),  # the smallest would fall below 1
    ([0.0], 1.0),
])
def test_cost_scale_is_a_power_of_two_into_range(costs, scale):
    assert cost_scale(np.array(costs)) == scale
    assert MAX_SCALED_COST == 2.0 ** 40


@pytest.mark.parametrize("factor", [1e-7, 1e7])
@pytest.mark.parametrize("extractor", ["ilp", "greedy"])
@pytest.mark.parametrize("name", list(GRAPHS))
def test_a_scaled_cost_model_extracts_the_same_graph(name, extractor, factor):
    # costs were rounded to whole numbers before the input graph's cost was compared with the extracted one,
    # and one unit of tie-breaking outweighed a model's costs below 1: the default / 1e7 fused nothing
    graph = GRAPHS[name]()
    ref_graph, ref = optimize(graph, extractor=extractor)
    assert ref.dispatches_after < ref.dispatches_before  # there is fusion to lose
    out, rep = optimize(graph, cost_model=_scaled(factor), extractor=extractor)
    assert rep.dispatches_after == ref.dispatches_after
    assert [(n.op, n.inputs, n.type) for n in out.live_nodes()] == [
        (n.op, n.inputs, n.type) for n in ref_graph.live_nodes()]
    assert graph_hash(out) == graph_hash(ref_graph)
    # reports in the model's own units
    assert rep.cost_before == pytest.approx(ref.cost_before * factor, rel=1e-12)
    assert rep.cost_after == pytest.approx(ref.cost_after * factor, rel=1e-12)
    got = rep.ilp_cost if extractor == "ilp" else rep.greedy_cost
    want = ref.ilp_cost if extractor == "ilp" else ref.greedy_cost
    assert got == pytest.approx(want * factor, rel=1e-5)  # up to the tie-breaking units


def test_costs_below_one_are_not_rounded():
    # the byte model in seconds at 1 TB/s: every kernel costs about a microsecond
    out, rep = optimize(_attention(), cost_model=_scaled(1e-12))
    want = CostModel().graph_cost(out) * 1e-12
    assert rep.cost_after == pytest.approx(want, rel=1e-12) and 0 < rep.cost_after < rep.cost_before < 1e-5
    assert rep.ilp_optimal and rep.extractor == "ilp" and rep.ilp_cost == pytest.approx(rep.cost_after, rel=1e-5)


def test_the_payoff_of_a_model_in_small_units_is_its_saving_not_zero():
    # savings were truncated to an int: every rule of a model in seconds saved 0 and none "paid"
    _, whole = optimize(_mlp(), payoff=True)
    _, small = optimize(_mlp(), cost_model=_scaled(1e-7), payoff=True)
    for field in ("rulesets", "rules"):
        want = {r["name"]: r["saved_cost"] * 1e-7 for r in getattr(whole, field)}
        got = {r["name"]: r["saved_cost"] for r in getattr(small, field)}
        assert got == pytest.approx(want, rel=1e-9, abs=1e-18)
    assert {r["name"] for r in small.rulesets if r["saved_cost"] > 0} == {"matmul_epilogue"}
    paid = next(r for r in whole.rulesets if r["name"] == "matmul_epilogue")["saved_cost"]
    assert isinstance(paid, int) and paid > 0  # a model of whole units keeps whole savings


class _KeyErrorCost(CostModel):
    def __init__(self, op: str) -> None:
        super().__init__()
        self.op = op

    def kernel_cost(self, k):
        if k.op == self.op:
            return {"MatMul": 1}[k.op]
        return super().kernel_cost(k)


@pytest.mark.parametrize("op", ["BiasAdd", "FusedMatMul"])  # in the input graph / only in the e-graph
@pytest.mark.parametrize("extractor", ["ilp", "greedy"])
def test_a_kernel_cost_that_raises_is_named(op, extractor):
    with pytest.raises(RewriteError, match=rf"cost model {__name__}:_KeyErrorCost: kernel_cost of {op} \(inputs "
                                           rf"\[.*\], output f32\[.*\]\) raised KeyError: '{op}'") as info:
        optimize(_mlp(), cost_model=_KeyErrorCost(op), extractor=extractor)
    assert isinstance(info.value.__cause__, KeyError)


RAISING_PY = '''
from eggfuse.rewrites import CostModel

class Raising(CostModel):
    def kernel_cost(self, k):
        return {"MatMul": 1}[k.op]

def boom():
    raise RuntimeError("boom in the builder")

def bad_shapes():
    from eggfuse.ir import Graph
    g = Graph()
    g.matmul(g.input("x", [2, 3]), g.input("y", [4, 5]))
'''


@pytest.fixture
def raising_file(tmp_path):
    path = tmp_path / "raising.py"
    path.write_text(RAISING_PY)
    return path


def test_a_graph_source_that_raises_is_named(raising_file):
    with pytest.raises(InputError, match=rf"graph source '{raising_file}:boom': boom\(\) raised RuntimeError: "
                                         "boom in the builder$") as info:
        load_graph(f"{raising_file}:boom")
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(GraphError):  # an eggfuse error of the builder's passes through as it is
        load_graph(f"{raising_file}:bad_shapes")


def test_the_cli_prints_errors_of_ones_own_code_on_one_line(raising_file, capsys, monkeypatch):
    monkeypatch.chdir(raising_file.parent)
    assert cli.main(["optimize", "raising:boom"]) == 2
    err = capsys.readouterr().err
    assert err == "eggfuse: error: graph source 'raising:boom': boom() raised RuntimeError: boom in the builder\n"
    assert cli.main(["optimize", "llama:1", "--cost-model", "raising:Raising"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eggfuse: error: cost model raising:Raising: kernel_cost of ") and err.count("\n") == 1
    assert "raised KeyError" in err and "Traceback" not in err
    assert cli.main(["optimize", "llama:1", "--cost-model", f"{raising_file}:Raising"]) == 2
    assert capsys.readouterr().err.startswith(f"eggfuse: error: cost model {raising_file}:Raising: kernel_cost of ")


@pytest.mark.parametrize("value, text", [(4195020, "4,195,020"), (4195020.0, "4,195,020"), (112340.25, "112,340.2"),
                                         (12.3456, "12.35"), (2.1e-7, "2.1e-07"), (4.3264e36, "4.326e+36"),
                                         (-16384, "-16,384")])
def test_reports_print_costs_in_the_models_own_unit(value, text):
    from eggfuse.rewrites.report import cost_text

    assert cost_text(value) == text
