"""Recurrent layers: the time loops of ONNX LSTM, GRU and RNN (LSTMRecurrence, GRURecurrence,
RNNRecurrence), one kernel each that walks the sequence with workgroup barriers between steps.

The input projection is not part of these ops: ``xw`` is X W^T + Wb for every step at once
(a matmul, computed before), [S, B, dirs * G * H] (layout 0) or [B, S, dirs * G * H] (layout
1), G the gates of the cell (LSTM 4: i, o, f, c; GRU 3: z, r, h; RNN 1), direction d's gates
at columns [d * G * H, (d + 1) * G * H). The ops take the recurrence weights r [dirs, G*H, H]
and bias rb [dirs, G*H], the initial state h0 (and c0) [dirs, B, H] (layout 1: [B, dirs, H]),
LSTM's peepholes [dirs, 3H] (i, o, f) and optionally the sequence lengths [B] (i32).
Semantics as the ONNX operators (https://onnx.ai/onnx/operators/onnx__LSTM.html, __GRU,
__RNN) and onnxruntime's implementation of them: ``clip`` (when > 0) bounds every gate's
input before its activation; a direction ``reverse`` (and the second direction of
``bidirectional``) walks t = len - 1 .. 0; steps t >= len of a batch entry are zero in Y and
leave its state alone, and an empty sequence ends in zero states (as onnxruntime's). The
output packs ONNX's outputs into one flat tensor: Y ([S, dirs, B, H], layout 1 [B, S, dirs,
H]), then Y_h, then (LSTM) Y_c (each [dirs, B, H], layout 1 [B, dirs, H]). The peepholes are
named ``peepholes`` (a binding named ``p`` would hide the kernel's uniform).

Activations are ONNX's names (Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu,
ScaledTanh, HardSigmoid, Elu, Softsign, Softplus), one per function of the cell (LSTM f, g,
h; GRU f, g; RNN f) and direction, with one alpha and one beta each (the converter fills in
the defaults).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InputError, LoweringError
from ..kernel import Kernel
from ..spec import Attr, need, need_f32, no_grad, op
from ..types import DType, TensorType
from .elementwise import sigmoid

FAMILY = "recurrent"

#: Gates per cell and activation functions per direction.
CELLS = {"LSTM": (4, 3), "GRU": (3, 2), "RNN": (1, 1)}
#: Bytes of workgroup memory recurrent.wgsl may take (the WebGPU default of
#: maxComputeWorkgroupStorageSize).
RECURRENT_WORKGROUP_BYTES = 16384


def _act(name: str, x, alpha: float, beta: float):
    """ONNX's recurrent activation ``name`` (the ops of the same names) of x, float64."""
    if name == "Relu":
        return np.maximum(x, 0.0)
    if name == "Tanh":
        return np.tanh(x)
    if name == "Sigmoid":
        return sigmoid(x)
    if name == "Affine":
        return alpha * x + beta
    if name == "LeakyRelu":
        return np.where(x >= 0, x, alpha * x)
    if name == "ThresholdedRelu":
        return np.where(x > alpha, x, 0.0)
    if name == "ScaledTanh":
        return alpha * np.tanh(beta * x)
    if name == "HardSigmoid":
        return np.clip(alpha * x + beta, 0.0, 1.0)
    if name == "Elu":
        return np.where(x >= 0, x, alpha * (np.exp(np.minimum(x, 0.0)) - 1.0))
    if name == "Softsign":
        return x / (1.0 + np.abs(x))
    return np.logaddexp(0.0, x)  # Softplus


#: WGSL of each activation of ``{x}`` with ``{a}``, ``{b}`` its alpha and beta (f32 literals).
ACTIVATIONS = {
    "Relu": "select({x}, 0.0, {x} < 0.0)", "Tanh": "tanh_clamped({x})", "Sigmoid": "sigmoid({x})",
    "Affine": "{a} * {x} + {b}",
    "LeakyRelu": "select({a} * {x}, {x}, {x} >= 0.0)", "ThresholdedRelu": "select(0.0, {x}, {x} > {a})",
    "ScaledTanh": "{a} * tanh_clamped({b} * {x})", "HardSigmoid": "clamp_nan({a} * {x} + {b}, 0.0, 1.0)",
    "Elu": "select({a} * (exp(min({x}, 0.0)) - 1.0), {x}, {x} >= 0.0)", "Softsign": "{x} / (1.0 + abs({x}))",
    "Softplus": "softplus({x})",
}


# --- shapes ------------------------------------------------------------------------------------


def recurrence_dims(cell: str, ts, a) -> dict[str, int]:
    """S, B, H, dirs of a recurrence op's inputs; ShapeError for inputs that do not fit."""
    gates, nact = CELLS[cell]
    need(a["direction"] in ("forward", "reverse", "bidirectional"),
         f"direction must be forward, reverse or bidirectional, got {a['direction']!r}")
    need(a["layout"] in (0, 1), f"layout must be 0 or 1, got {a['layout']}")
    dirs = 2 if a["direction"] == "bidirectional" else 1
    xw, r = ts[0], ts[1]
    need_f32(xw, "xw")
    need_f32(r, "r")
    need(r.rank == 3 and r.shape[0] == dirs and r.shape[1] == gates * r.shape[2],
         f"r must be [{dirs}, {gates}*H, H], got {r}")
    h = r.shape[2]
    need(xw.rank == 3 and xw.shape[2] == dirs * gates * h, f"xw must be 3-D [.., .., {dirs * gates * h}], got {xw}")
    s, b = (xw.shape[0], xw.shape[1]) if a["layout"] == 0 else (xw.shape[1], xw.shape[0])
    state = (dirs, b, h) if a["layout"] == 0 else (b, dirs, h)
    names = ["rb", "h0"] + (["c0", "p"] if cell == "LSTM" else [])
    fixed = {"rb": (dirs, gates * h), "h0": state, "c0": state, "p": (dirs, 3 * h)}
    need(len(ts) in (2 + len(names), 3 + len(names)), f"takes xw, r, {', '.join(names)} and optionally seq_lens")
    for t, name in zip(ts[2:], names, strict=False):
        need_f32(t, name)
        need(t.shape == fixed[name], f"{name} must be {list(fixed[name])}, got {t}")
    if len(ts) == 3 + len(names):
        need(ts[-1].dtype is DType.I32 and ts[-1].shape == (b,), f"seq_lens must be i32 [{b}], got {ts[-1]}")
    need(len(a["activations"]) == nact * dirs and len(a["activation_alpha"]) == nact * dirs
         and len(a["activation_beta"]) == nact * dirs,
         f"activations, activation_alpha and activation_beta need {nact * dirs} entries each, got "
         f"{a['activations']}, {a['activation_alpha']}, {a['activation_beta']}")
    for name in a["activations"]:
        need(name in ACTIVATIONS, f"activation {name!r} is not one of {', '.join(ACTIVATIONS)}")
    need(a["clip"] >= 0, f"clip must be >= 0 (0: none), got {a['clip']}")
    return dict(S=s, B=b, H=h, dirs=dirs, G=gates)


def _rule(cell: str):
    def infer(ts, a):
        d = recurrence_dims(cell, ts, a)
        states = 2 if cell == "LSTM" else 1
        return TensorType(((d["S"] + states) * d["dirs"] * d["B"] * d["H"],))

    return infer


# --- the reference -----------------------------------------------------------------------------


def recurrence_ref(cell: str, xs, a) -> np.ndarray:
    """The packed outputs (Y, Y_h[, Y_c]) of the recurrence ``cell`` (module docstring), float64."""
    d = recurrence_dims(cell, [TensorType(x.shape, DType.I32 if x.dtype.kind == "i" else DType.F32) for x in xs], a)
    s, b, h, dirs, gates = d["S"], d["B"], d["H"], d["dirs"], d["G"]
    nact = CELLS[cell][1]
    xw, r, rb = xs[0], xs[1], xs[2]
    if a["layout"] == 1:
        xw = xw.transpose(1, 0, 2)
    state = [x if a["layout"] == 0 else x.transpose(1, 0, 2) for x in xs[3:5 if cell == "LSTM" else 4]]
    given = len(xs) == (7 if cell == "LSTM" else 5)  # the sequence lengths come last
    lens = np.asarray(xs[-1], dtype=np.int64) if given else np.full(b, s)
    if lens.min() < 0 or lens.max() > s:
        raise InputError(f"{cell}Recurrence: sequence lengths {lens.tolist()} must lie in [0, {s}]")
    clip = a["clip"]
    y = np.zeros((s, dirs, b, h))
    y_h, y_c = np.zeros((dirs, b, h)), np.zeros((dirs, b, h))

    def pre(x):
        return np.clip(x, -clip, clip) if clip > 0 else x

    for di in range(dirs):
        acts = [lambda x, k=di * nact + k: _act(a["activations"][k], x, a["activation_alpha"][k],
                                                a["activation_beta"][k]) for k in range(nact)]
        reverse = a["direction"] == "reverse" or di == 1
        rw, bias = r[di], rb[di]
        for bi in range(b):
            hp = state[0][di, bi].copy()
            cp = state[1][di, bi].copy() if cell == "LSTM" else None
            for step in range(lens[bi]):
                t = lens[bi] - 1 - step if reverse else step
                x = xw[t, bi, di * gates * h:(di + 1) * gates * h]
                if cell == "LSTM":
                    g = x + rw @ hp + bias
                    pi, po, pf = np.split(xs[5][di], 3)
                    i = acts[0](pre(g[:h] + pi * cp))
                    f = 1.0 - i if a["input_forget"] else acts[0](pre(g[2 * h:3 * h] + pf * cp))
                    cp = f * cp + i * acts[1](pre(g[3 * h:]))
                    o = acts[0](pre(g[h:2 * h] + po * cp))
                    hp = o * acts[2](cp)
                elif cell == "GRU":
                    z = acts[0](pre(x[:h] + rw[:h] @ hp + bias[:h]))
                    rr = acts[0](pre(x[h:2 * h] + rw[h:2 * h] @ hp + bias[h:2 * h]))
                    if a["linear_before_reset"]:
                        cand = x[2 * h:] + rr * (rw[2 * h:] @ hp + bias[2 * h:])
                    else:
                        cand = x[2 * h:] + rw[2 * h:] @ (rr * hp) + bias[2 * h:]
                    hp = (1.0 - z) * acts[1](pre(cand)) + z * hp
                else:
                    hp = acts[0](pre(x + rw @ hp + bias))
                y[t, di, bi] = hp
            if lens[bi] > 0:  # an empty sequence ends in zero states, as onnxruntime's
                y_h[di, bi] = hp
                if cell == "LSTM":
                    y_c[di, bi] = cp
    if a["layout"] == 1:
        y, y_h, y_c = y.transpose(2, 0, 1, 3), y_h.transpose(1, 0, 2), y_c.transpose(1, 0, 2)
    parts = [y, y_h] + ([y_c] if cell == "LSTM" else [])
    return np.concatenate([p.reshape(-1) for p in parts])


# --- the kernel --------------------------------------------------------------------------------

_LSTM_STEP = """
for (var u = 0u; u < UPI; u = u + 1u) {
    let j = li + u * WG;
    if (j < H) {
        let cp = c_reg[u];
        let pb = dir * 3u * H;
        let i = act0(dir, pre(xw[xb + j] + rb[rrow + j] + rdot(rrow + j) + peepholes[pb + j] * cp));
        var f = 1.0 - i;
        if (p.input_forget == 0u) {
            f = act0(dir, pre(xw[xb + 2u * H + j] + rb[rrow + 2u * H + j] + rdot(rrow + 2u * H + j)
                              + peepholes[pb + 2u * H + j] * cp));
        }
        let c = f * cp + i * act1(dir, pre(xw[xb + 3u * H + j] + rb[rrow + 3u * H + j] + rdot(rrow + 3u * H + j)));
        let o = act0(dir, pre(xw[xb + H + j] + rb[rrow + H + j] + rdot(rrow + H + j) + peepholes[pb + H + j] * c));
        c_reg[u] = c;
        h_reg[u] = o * act2(dir, c);
    }
}"""

_GRU_STEP = """
for (var u = 0u; u < UPI; u = u + 1u) {
    let j = li + u * WG;
    if (j < H) {
        let z = act0(dir, pre(xw[xb + j] + rb[rrow + j] + rdot(rrow + j)));
        let rr = act0(dir, pre(xw[xb + H + j] + rb[rrow + H + j] + rdot(rrow + H + j)));
        z_reg[u] = z;
        if (p.linear_before_reset != 0u) {
            let cand = act1(dir, pre(xw[xb + 2u * H + j] + rr * (rdot(rrow + 2u * H + j) + rb[rrow + 2u * H + j])));
            h_reg[u] = (1.0 - z) * cand + z * h_prev[j];
        } else {
            rh[j] = rr * h_prev[j];
        }
    }
}
workgroupBarrier();
if (p.linear_before_reset == 0u) {
    for (var u = 0u; u < UPI; u = u + 1u) {
        let j = li + u * WG;
        if (j < H) {
            var s = 0.0;
            let base = (rrow + 2u * H + j) * H;
            for (var m = 0u; m < H; m = m + 1u) {
                s = s + r[base + m] * rh[m];
            }
            let cand = act1(dir, pre(xw[xb + 2u * H + j] + s + rb[rrow + 2u * H + j]));
            h_reg[u] = (1.0 - z_reg[u]) * cand + z_reg[u] * h_prev[j];
        }
    }
}"""

_RNN_STEP = """
for (var u = 0u; u < UPI; u = u + 1u) {
    let j = li + u * WG;
    if (j < H) {
        h_reg[u] = act0(dir, pre(xw[xb + j] + rb[rrow + j] + rdot(rrow + j)));
    }
}"""

_STEPS = {"LSTM": _LSTM_STEP, "GRU": _GRU_STEP, "RNN": _RNN_STEP}


def _indent(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line if line else line for line in text.strip("\n").splitlines())


def _f32(v: float) -> str:
    """A WGSL f32 literal of ``v`` (finite)."""
    text = repr(float(np.float32(v)))
    return text if any(c in text for c in ".e") else text + ".0"


def activation_wgsl(a, nact: int, dirs: int) -> str:
    """``fn act<k>(dir, x)`` for each of the cell's functions, selecting the direction's."""
    fns = []
    for k in range(nact):
        exprs = [ACTIVATIONS[a["activations"][d * nact + k]].format(
            x="x", a=_f32(a["activation_alpha"][d * nact + k]), b=_f32(a["activation_beta"][d * nact + k]))
            for d in range(dirs)]
        body = f"    return {exprs[0]};" if dirs == 1 else \
            f"    if (dir == 0u) {{\n        return {exprs[0]};\n    }}\n    return {exprs[1]};"
        fns.append(f"fn act{k}(dir: u32, x: f32) -> f32 {{\n{body}\n}}")
    return "\n\n".join(fns)


def _kernel(cell: str):
    def build(node, ins, target) -> Kernel:
        a = node.attrs
        d = recurrence_dims(cell, ins, a)
        h, dirs = d["H"], d["dirs"]
        shared = h * 4 * (2 if cell == "GRU" else 1)
        if shared > RECURRENT_WORKGROUP_BYTES:
            raise LoweringError(f"{node.op} (node {node.id}, r {ins[1]}): hidden size {h} needs {shared} bytes of "
                                f"workgroup memory, above the {RECURRENT_WORKGROUP_BYTES} every device offers "
                                "(maxComputeWorkgroupStorageSize)")
        wg = next(w for w in (32, 64, 128, 256) if h <= w or w == 256)
        lens = len(ins) == (7 if cell == "LSTM" else 5)
        n = d["dirs"] * d["B"] * h
        slots = dict(HIDDEN=h, GATES=d["G"], WG=wg, UNITS=math.ceil(h / wg),
                     SHARED="var<workgroup> rh: array<f32, H>;" if cell == "GRU" else "",
                     ACTIVATIONS=activation_wgsl(a, CELLS[cell][1], dirs),
                     CLIP="clamp(x, -p.clip, p.clip)" if a["clip"] > 0 else "x",
                     SEQ_LEN="u32(clamp(seq_lens[b], 0, i32(p.seq)))" if lens else "p.seq",
                     CELL=_indent(_STEPS[cell], 8),
                     INIT=" " * 12 + "c_reg[u] = c0[state_index(dir, b, j)];" if cell == "LSTM" else "",
                     FINAL=" " * 12 + "out[p.yc_off + state_index(dir, b, j)] = select(0.0, c_reg[u], len > 0u);"
                     if cell == "LSTM" else "")
        params = (("seq", "u32", d["S"]), ("batch", "u32", d["B"]), ("dirs", "u32", dirs),
                  ("total", "u32", dirs * d["B"]), ("batch_major", "u32", a["layout"]),
                  ("reverse_all", "u32", int(a["direction"] == "reverse")), ("clip", "f32", a["clip"]),
                  ("input_forget", "u32", int(a.get("input_forget", False))),
                  ("linear_before_reset", "u32", int(a.get("linear_before_reset", False))),
                  ("yh_off", "u32", d["S"] * n), ("yc_off", "u32", (d["S"] + 1) * n))
        return Kernel(f"{cell.lower()}_recurrence_h{h}", "recurrent.wgsl", dirs * d["B"], params=params, slots=slots)

    return build


def _flops(cell: str):
    def count(ins, out, a) -> int:
        d = recurrence_dims(cell, ins, a)
        return 2 * d["S"] * d["dirs"] * d["B"] * d["G"] * d["H"] * d["H"]

    return count


_COMMON = (Attr("direction", "str", "forward"), Attr("layout", "int", 0), Attr("activations", "json"),
           Attr("activation_alpha", "floats"), Attr("activation_beta", "floats"),
           Attr("clip", "float", 0.0, "bound on every gate input when > 0"))
_EXTRA = {"LSTM": (Attr("input_forget", "bool", False, "f = 1 - i"),),
          "GRU": (Attr("linear_before_reset", "bool", False),), "RNN": ()}
_INPUTS = {"LSTM": ("xw", "r", "rb", "h0", "c0", "peepholes", "seq_lens?"),
           "GRU": ("xw", "r", "rb", "h0", "seq_lens?"), "RNN": ("xw", "r", "rb", "h0", "seq_lens?")}
_DOCS = {
    "LSTM": "the time loop of ONNX LSTM (Hochreiter & Schmidhuber 1997, peepholes of Gers & Schmidhuber 2000; "
            "https://onnx.ai/onnx/operators/onnx__LSTM.html): i = f(x_i + r_i h + P_i c), f = f(x_f + r_f h + P_f c) "
            "(1 - i with input_forget), c' = f c + i g(x_c + r_c h), o = f(x_o + r_o h + P_o c'), h' = o h(c')",
    "GRU": "the time loop of ONNX GRU (Cho et al. 2014; https://onnx.ai/onnx/operators/onnx__GRU.html): z = f(x_z + "
           "r_z h), r = f(x_r + r_r h), h~ = g(x_h + (r * h) R_h^T + Rb_h) (linear_before_reset: g(x_h + r * (R_h h + "
           "Rb_h))), h' = (1 - z) h~ + z h",
    "RNN": "the time loop of ONNX RNN (https://onnx.ai/onnx/operators/onnx__RNN.html): h' = f(x + r h + rb)",
}

for _cell in CELLS:
    op(f"{_cell}Recurrence", _INPUTS[_cell], _rule(_cell), (lambda c: lambda xs, a: recurrence_ref(c, xs, a))(_cell),
       attrs=(*_COMMON, *_EXTRA[_cell]), vjp=no_grad("an inference op of the ONNX import"), kernel=_kernel(_cell),
       flops=_flops(_cell),
       doc=_DOCS[_cell] + "; inputs and the packed output (Y, Y_h, LSTM's Y_c) as the recurrent module docstring "
           "says (x_* the gates' columns of xw, the recurrence bias rb added to r h)")
