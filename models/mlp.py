"""A multilayer perceptron classifier and scikit-learn's bundled digits data set.

The model: x [B, in] -> MatMul + bias -> ReLU -> ... -> MatMul + bias -> logits [B, classes],
with ``CrossEntropyLoss`` against one-hot labels (the mean over rows of the softmax
cross-entropy). Weights are stored [in, out] (applied with ``matmul``) and drawn with He
initialisation (He et al. 2015) for the ReLU layers, Glorot (Glorot & Bengio 2010) for the
last; biases start at zero.

The data: ``sklearn.datasets.load_digits`` (1,797 8x8 images of handwritten digits, pixel
values 0..16, shipped inside scikit-learn: nothing is downloaded), scaled to [0, 1] and split
by a seeded permutation into 1,437 training and 360 test images.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from eggfuse.ir import Graph, GraphError, InputError, ModelError, NodeId

DIGITS_FEATURES, DIGITS_CLASSES, DIGITS_TEST = 64, 10, 360


def build_mlp_graph(batch: int, sizes: Sequence[int] = (DIGITS_FEATURES, 64, DIGITS_CLASSES)) -> tuple[Graph, NodeId]:
    """The MLP for ``batch`` rows with layer widths ``sizes`` (input, hidden..., classes).

    Inputs: ``x`` f32 [batch, sizes[0]], ``labels`` f32 [batch, sizes[-1]] (one-hot rows; an
    all-zero row adds nothing to the loss sum but still counts in the mean). Parameters
    ``w{i}`` [sizes[i-1], sizes[i]] and ``b{i}`` [sizes[i]] for i = 1.. . The graph's output
    is the logits [batch, classes]; the returned node is the f32[1] loss, for
    :class:`~eggfuse.trainer.Trainer`. Raises GraphError for fewer than two sizes or a
    size or batch below 1.
    """
    if len(sizes) < 2:
        raise GraphError(f"MLP: sizes needs an input and an output width, got {list(sizes)}")
    g = Graph()
    h = g.input("x", [batch, sizes[0]])
    labels = g.input("labels", [batch, sizes[-1]])
    for i in range(1, len(sizes)):
        w = g.parameter(f"w{i}", [sizes[i - 1], sizes[i]])
        h = g.bias_add(g.matmul(h, w), g.parameter(f"b{i}", [sizes[i]]))
        if i < len(sizes) - 1:
            h = g.relu(h)
    g.set_outputs([h])
    return g, g.add_node("CrossEntropyLoss", (h, labels))


def init_mlp_params(sizes: Sequence[int], seed: int = 0) -> dict[str, np.ndarray]:
    """Float32 parameters for :func:`build_mlp_graph`: He-normal weights before a ReLU,
    Glorot-normal for the last layer, zero biases; ``seed`` fixes the draw."""
    rng = np.random.default_rng(seed)
    params = {}
    for i in range(1, len(sizes)):
        fan_in, fan_out = sizes[i - 1], sizes[i]
        std = np.sqrt(2.0 / fan_in) if i < len(sizes) - 1 else np.sqrt(2.0 / (fan_in + fan_out))
        params[f"w{i}"] = (std * rng.standard_normal((fan_in, fan_out))).astype(np.float32)
        params[f"b{i}"] = np.zeros(fan_out, dtype=np.float32)
    return params


@dataclass(frozen=True)
class Digits:
    """The digits split: features f32 [N, 64] in [0, 1], labels int [N] (0..9)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_digits_split(seed: int = 0, test_size: int = DIGITS_TEST) -> Digits:
    """scikit-learn's digits, pixels / 16, split by ``numpy.random.default_rng(seed).permutation``:
    the first ``test_size`` images of the permutation are the test set (default 360 of
    1,797, leaving 1,437 for training). Raises ModelError when scikit-learn is not
    installed or ``test_size`` leaves no training or test image."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ModelError("the digits data ships with scikit-learn: pip install 'eggfuse[models]' "
                         "(or pip install scikit-learn)") from None
    data = load_digits()
    x = np.asarray(data.data, dtype=np.float32) / np.float32(16.0)
    y = np.asarray(data.target, dtype=np.int64)
    if not 0 < test_size < len(x):
        raise ModelError(f"digits: test_size must lie in [1, {len(x) - 1}], got {test_size}")
    order = np.random.default_rng(seed).permutation(len(x))
    test, train = order[:test_size], order[test_size:]
    return Digits(x[train], y[train], x[test], y[test])


def one_hot(labels: np.ndarray, classes: int = DIGITS_CLASSES) -> np.ndarray:
    """Float32 [N, classes] one-hot rows of integer ``labels`` [N]."""
    return np.eye(classes, dtype=np.float32)[np.asarray(labels, dtype=np.int64)]


def batches(n: int, batch: int, seed: int) -> Iterator[np.ndarray]:
    """Endless index batches over ``n`` examples: each epoch a new seeded permutation cut
    into ``n // batch`` full batches; the last ``n % batch`` of each permutation are dropped
    (the plan has static shapes), a different few every epoch."""
    if not 1 <= batch <= n:  # checked here, not at the first next()
        raise InputError(f"batch must lie in [1, {n}] (the training set), got {batch}")
    return _epochs(n, batch, np.random.default_rng(seed))


def _epochs(n: int, batch: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    while True:
        order = rng.permutation(n)
        for start in range(0, n - batch + 1, batch):
            yield order[start:start + batch]
