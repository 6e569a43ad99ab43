"""LSTMRecurrence, GRURecurrence and RNNRecurrence on the GPU against the numpy reference
(tests/op_table.py): both layouts, every direction, sequence lengths (0 included), clip,
input_forget, linear_before_reset, every activation, hidden sizes below one workgroup, of
one and of several units per invocation."""

from __future__ import annotations

import numpy as np
import pytest
from op_table import Row, check_row  # tests/op_table.py

from eggfuse.ir import DType, Graph
from eggfuse.ir.ops.recurrent import CELLS

_DEFAULT = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}


def _row(tag: str, cell: str, seq: int, batch: int, hidden: int, *, direction: str = "forward", layout: int = 0,
         lens=None, activations=None, alpha=None, beta=None, scale: float = 0.5, **attrs) -> Row:
    gates, nact = CELLS[cell]
    dirs = 2 if direction == "bidirectional" else 1
    acts = tuple(activations or _DEFAULT[cell] * dirs)
    attrs.update(direction=direction, layout=layout, activations=acts,
                 activation_alpha=tuple(alpha or [0.0] * len(acts)), activation_beta=tuple(beta or [0.0] * len(acts)))

    def build(g: Graph) -> int:
        xw_shape = [seq, batch, dirs * gates * hidden] if layout == 0 else [batch, seq, dirs * gates * hidden]
        state = [dirs, batch, hidden] if layout == 0 else [batch, dirs, hidden]
        ins = [g.input("xw", xw_shape), g.parameter("r", [dirs, gates * hidden, hidden]),
               g.parameter("rb", [dirs, gates * hidden]), g.input("h0", state)]
        if cell == "LSTM":
            ins += [g.input("c0", state), g.parameter("peepholes", [dirs, 3 * hidden])]
        if lens is not None:
            ins.append(g.input("seq_lens", [batch], DType.I32))
        return g.add_node(f"{cell}Recurrence", ins, **attrs)

    feeds = {} if lens is None else {"seq_lens": np.array(lens, dtype=np.int32)}
    return Row(f"{cell}Recurrence", f"{cell}Recurrence-{tag}", build, feeds, scale=scale)


ROWS: list[Row] = [
    _row("forward", "LSTM", 4, 2, 3),
    _row("bidirectional-lens-clip-forget", "LSTM", 5, 3, 6, direction="bidirectional", lens=[5, 0, 2], clip=0.7,
         input_forget=True, activations=("Sigmoid", "Tanh", "Tanh", "HardSigmoid", "Softsign", "Elu"),
         alpha=(0, 0, 0, 0.3, 0, 0.8), beta=(0, 0, 0, 0.45, 0, 0)),
    _row("reverse-batch-major-h130", "LSTM", 3, 2, 130, direction="reverse", layout=1, scale=0.2),
    _row("h300-lens", "LSTM", 3, 2, 300, lens=[1, 3], scale=0.1),
    _row("forward", "GRU", 4, 2, 5),
    _row("bidirectional-lbr-lens", "GRU", 4, 3, 7, direction="bidirectional", linear_before_reset=True,
         lens=[2, 4, 1]),
    _row("reverse-batch-major-h300", "GRU", 3, 2, 300, direction="reverse", layout=1, scale=0.1),
    _row("acts-clip", "GRU", 3, 2, 4, activations=("ScaledTanh", "Softplus"), alpha=(0.9, 0), beta=(1.3, 0),
         clip=1.5),
    _row("forward", "RNN", 5, 2, 4),
    _row("bidirectional-relu-leaky-clip", "RNN", 4, 2, 6, direction="bidirectional", clip=2.0,
         activations=("Relu", "LeakyRelu"), alpha=(0, 0.2), lens=[4, 3]),
    _row("affine-batch-major", "RNN", 3, 3, 33, layout=1, activations=("Affine",), alpha=(0.5,), beta=(0.1,)),
    _row("thresholded-reverse", "RNN", 3, 2, 8, direction="reverse", activations=("ThresholdedRelu",),
         alpha=(0.2,)),
    _row("sigmoid-h257", "RNN", 2, 1, 257, activations=("Sigmoid",), scale=0.1),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_op_matches_reference(row: Row, device):
    check_row(row, device, subgroups=None)
