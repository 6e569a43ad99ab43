"""A rule of one's own as a user keeps it, in a module outside eggfuse: the tests of rulesets named
``module:NAME`` / ``file.py:NAME`` (``--rulesets``, ``--with-ruleset``, the sweep) write it to a file."""

#: The rule's name, as ``--report`` and the payoff rows give it.
FACTOR = "Add(MatMul(a,b), MatMul(a,c)) -> MatMul(a, Add(b,c))"


def rules_module(ruleset: str) -> str:
    """The module's text: ``factor_matmul`` (FACTOR), ``MINE`` (a ruleset named ``ruleset`` holding it),
    ``SHADOW`` (one named like the shipped ``algebraic``), ``NUMBER`` (no ruleset) and ``two_products()``,
    relu(x @ w1 + x @ w2): MatMul, MatMul, Add, Relu, 4 dispatches unoptimised; with the rule, Add(w1, w2),
    one MatMul and Relu: 3."""
    return f'''
from eggfuse.ir import Graph
from eggfuse.rewrites import make_ruleset


def factor_matmul(e):
    a, b, c = e.vars("a b c")
    yield e.equal({FACTOR!r},
                  e.Add(e.MatMul(a, b), e.MatMul(a, c)), e.MatMul(a, e.Add(b, c)))


MINE = make_ruleset({ruleset!r}, factor_matmul)
SHADOW = make_ruleset("algebraic", factor_matmul)
NUMBER = 3


def two_products():
    g = Graph()
    x = g.input("x", [8, 32])
    w1, w2 = g.parameter("w1", [32, 16]), g.parameter("w2", [32, 16])
    g.set_outputs([g.relu(g.add(g.matmul(x, w1), g.matmul(x, w2)))])
    return g
'''
