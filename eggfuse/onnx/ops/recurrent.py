"""LSTM, GRU and RNN: the input projection X W^T + Wb of every step as one MatMulBT (both
directions at once), then one recurrence kernel (``LSTMRecurrence``, ``GRURecurrence``,
``RNNRecurrence``, ir/ops/recurrent.py) that walks the sequence with workgroup barriers
between the steps, its packed output sliced into Y, Y_h and Y_c.

Every attribute of the ONNX operators is taken: direction, hidden_size, layout, clip,
input_forget (LSTM), linear_before_reset (GRU), activations with activation_alpha and
activation_beta (each list consumed in order by the activations that take a value, as
onnxruntime reads them; LeakyRelu, HardSigmoid and Elu default to their ONNX operators'
values, while Affine, ThresholdedRelu and ScaledTanh must be given theirs, since the ONNX
operators' defaults and onnxruntime's differ), and every optional input (B, sequence_lens,
initial_h, initial_c, P). A sequence length of 0 gives zero states (as onnxruntime).
"""

from __future__ import annotations

import numpy as np

from eggfuse.ir.ops.recurrent import ACTIVATIONS, CELLS

from ..importer import NodeContext, Value, converter

_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
_NAMES = {name.lower(): name for name in ACTIVATIONS}
#: (takes alpha, takes beta) and the defaults where the ONNX operators and onnxruntime agree.
_PARAMS = {"Affine": (True, True), "LeakyRelu": (True, False), "ThresholdedRelu": (True, False),
           "ScaledTanh": (True, True), "HardSigmoid": (True, True), "Elu": (True, False)}
_DEFAULTS = {"LeakyRelu": (0.01, 0.0), "HardSigmoid": (0.2, 0.5), "Elu": (1.0, 0.0)}
_ATTRS = ("activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size", "layout")


def _activations(ctx: NodeContext, cell: str, dirs: int) -> dict:
    nact = CELLS[cell][1]
    given = ctx.attr("activations")
    if given is None:
        names = list(_DEFAULT_ACTIVATIONS[cell]) * dirs
    else:
        names = []
        for name in given:
            if name.lower() not in _NAMES:
                raise ctx.fail(f"activation {name!r} is not one of {', '.join(ACTIVATIONS)}")
            names.append(_NAMES[name.lower()])
        if len(names) == nact and dirs == 2:
            names = names * 2
        elif cell == "RNN" and dirs == 1 and len(names) == 2:
            names = names[:1]  # the schema's default lists one per direction of a bidirectional RNN
        elif len(names) != nact * dirs:
            raise ctx.fail(f"activations {list(given)}: {cell} takes {nact} per direction ({nact * dirs} here)")
    alphas, betas = list(ctx.attr("activation_alpha", ())), list(ctx.attr("activation_beta", ()))
    alpha, beta = [], []
    for name in names:
        takes = _PARAMS.get(name, (False, False))
        default = _DEFAULTS.get(name)
        values = []
        for wanted, pool, k in ((takes[0], alphas, 0), (takes[1], betas, 1)):
            if wanted and pool:
                values.append(float(pool.pop(0)))
            elif wanted and default is None:
                raise ctx.fail(f"activation {name} needs its {'alpha' if k == 0 else 'beta'} in activation_"
                               f"{'alpha' if k == 0 else 'beta'} (its ONNX default and onnxruntime's differ)")
            else:
                values.append(default[k] if default else 0.0)
        alpha.append(values[0])
        beta.append(values[1])
    return dict(activations=tuple(names), activation_alpha=tuple(alpha), activation_beta=tuple(beta))


def _recurrent(ctx: NodeContext, cell: str) -> list[Value | None]:
    extra = {"LSTM": ("input_forget",), "GRU": ("linear_before_reset",), "RNN": ()}[cell]
    ctx.refuse_attrs(_ATTRS + extra)
    gates = CELLS[cell][0]
    direction = ctx.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ctx.fail(f"attribute direction={direction!r} is not forward, reverse or bidirectional")
    dirs = 2 if direction == "bidirectional" else 1
    layout = ctx.attr("layout", 0)
    if layout not in (0, 1):
        raise ctx.fail(f"attribute layout={layout} is not 0 or 1")
    x, w, r = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if len(x) != 3 or len(w) != 3 or len(r) != 3 or w[0] != dirs or r[0] != dirs or w[1] != r[1] \
            or r[1] != gates * r[2] or w[2] != x[2]:
        raise ctx.fail(f"X {list(x)}, W {list(w)} and R {list(r)} do not fit {cell} (X [seq, batch, input] or "
                       f"[batch, seq, input] for layout 1, W [{dirs}, {gates}*hidden, input], R [{dirs}, "
                       f"{gates}*hidden, hidden])")
    h = r[2]
    if ctx.attr("hidden_size", h) != h:
        raise ctx.fail(f"attribute hidden_size={ctx.attr('hidden_size')} but R {list(r)} has {h} hidden units")
    seq, batch = (x[0], x[1]) if layout == 0 else (x[1], x[0])
    gh = gates * h
    state = [dirs, batch, h] if layout == 0 else [batch, dirs, h]
    attrs = dict(direction=direction, layout=layout, clip=float(ctx.attr("clip", 0.0)), **_activations(ctx, cell, dirs))
    if attrs["clip"] < 0:
        raise ctx.fail(f"attribute clip={attrs['clip']} must be > 0")
    if cell == "LSTM":
        attrs["input_forget"] = bool(ctx.attr("input_forget", 0))
    if cell == "GRU":
        attrs["linear_before_reset"] = bool(ctx.attr("linear_before_reset", 0))

    rows = ctx.add("Identity", [ctx.tensor(0)], shape=[seq * batch, x[2]])
    xw = ctx.add("MatMulBT", [rows, ctx.add("Identity", [ctx.tensor(1)], shape=[dirs * gh, x[2]])])
    rb = None
    if ctx.has(3):
        if ctx.shape(3) != (dirs, 2 * gh):
            raise ctx.fail(f"B {list(ctx.shape(3))} must be [{dirs}, {2 * gh}]")
        if ctx.value(3).const is not None:
            bias = np.asarray(ctx.const(3), dtype=np.float32)
            wb, rb = ctx.constant(bias[:, :gh].reshape(-1)), ctx.constant(bias[:, gh:])
        else:
            both = ctx.tensor(3)
            wb = ctx.add("Identity", [ctx.add("SliceCols", [both], start=0, size=gh)], shape=[dirs * gh])
            rb = ctx.add("SliceCols", [both], start=gh, size=gh)
        xw = ctx.add("BiasAdd", [xw, wb])
    xw = ctx.add("Identity", [xw], shape=[x[0], x[1], dirs * gh])
    ins = [xw, ctx.tensor(2), rb if rb is not None else ctx.constant(np.zeros((dirs, gh), np.float32))]
    optional = [(5, state, "initial_h")]
    if cell == "LSTM":
        optional += [(6, state, "initial_c"), (7, [dirs, 3 * h], "P")]
    for i, shape, what in optional:
        if ctx.has(i):
            if list(ctx.shape(i)) != shape:
                raise ctx.fail(f"{what} {list(ctx.shape(i))} must be {shape}")
            ins.append(ctx.tensor(i))
        else:
            ins.append(ctx.constant(np.zeros(shape, np.float32)))
    if ctx.has(4):
        if ctx.shape(4) != (batch,):
            raise ctx.fail(f"sequence_lens {list(ctx.shape(4))} must be [{batch}]")
        known = ctx.value(4).const
        if known is not None and (known.min() < 0 or known.max() > seq):
            raise ctx.fail(f"sequence_lens {known.tolist()} must lie in [0, {seq}]")
        if known is None or (known != seq).any():
            ins.append(ctx.tensor(4))
    packed = ctx.add(f"{cell}Recurrence", ins, **attrs)
    n = dirs * batch * h
    flat = ctx.add("Identity", [packed], shape=[1, ctx.graph.node(packed).type.num_elements])
    shapes = ([seq, dirs, batch, h] if layout == 0 else [batch, seq, dirs, h], state, state)
    parts = [(0, seq * n), (seq * n, n), ((seq + 1) * n, n)][:3 if cell == "LSTM" else 2]
    outs: list[Value | None] = []
    for k, ((start, size), shape) in enumerate(zip(parts, shapes, strict=False)):
        if k < len(ctx.node.output) and ctx.node.output[k]:
            piece = ctx.add("SliceCols", [flat], start=start, size=size)
            outs.append(ctx.out(ctx.add("Identity", [piece], shape=shape)))
        else:
            outs.append(None)
    return outs


@converter("LSTM")
def _lstm(ctx: NodeContext) -> list[Value | None]:
    return _recurrent(ctx, "LSTM")


@converter("GRU")
def _gru(ctx: NodeContext) -> list[Value | None]:
    return _recurrent(ctx, "GRU")


@converter("RNN")
def _rnn(ctx: NodeContext) -> list[Value | None]:
    return _recurrent(ctx, "RNN")
