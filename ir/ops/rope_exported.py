"""Rotate-half RoPE as exporters spell it, recognised into RoPE.

transformers' ``apply_rotary_pos_emb`` on q or k [batch, heads, seq, head_dim] is

    x * cos + rotate_half(x) * sin,    rotate_half(x) = Concat(Neg(x[..., D/2:]), x[..., :D/2])

with cos and sin tables [.., seq, head_dim] (each half the same: cos(pos * inv_freq) twice).
Without position inputs they are folded at load time into constants, which the value fact
``rope_table`` (defined here) identifies: which function, theta, head_dim and the frequency
scaling (none, or ``linear``). On the head-split view of [batch * seq, heads * head_dim] rows
(``Permute(Reshape(rows, [B, S, H, D]), [0, 2, 1, 3])``, the projection's layout) the rotation is
``RoPE`` of those rows, batch B, positions 0..S-1, pairing ``half`` (Su et al. 2021; the
GPT-NeoX / Hugging Face layout).
"""

from __future__ import annotations

import json

import numpy as np

from ..facts import uniform_leading, value_fact
from ..spec import example, rules
from ..types import DType, TensorType
from .transformer import rope_inv_freq

FAMILY = "rope_exported"

_HEADS = (0, 2, 1, 3)


def table_tolerance(rows: int) -> float:
    """Absolute tolerance of a RoPE table of ``rows`` positions against cos / sin of the exact
    angles: float32 angles pos * inv_freq are off by up to pos * 2^-24 relative."""
    return 1e-6 + 1.2e-7 * rows


def rope_tables(positions: int, theta: float, head_dim: int, scaling=None) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) tables [positions, head_dim] of Hugging Face's rotary embedding: the angles
    pos * rope_inv_freq(theta, head_dim, scaling), each half the same."""
    ang = np.arange(positions)[:, None] * rope_inv_freq(theta, head_dim, scaling)[None, :]
    return np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))


def _snapped(theta: float):
    """Candidates for a theta measured from a float32 table: rounded to 1..6 significant digits, then as measured."""
    out = []
    for digits in range(1, 7):
        t = float(f"{theta:.{digits}g}")
        if t > 1 and t not in out:
            out.append(t)
    return [*out, theta]


@value_fact("rope_table", ("str", "float", "int", "str"),
            doc="rope_table(t, kind, theta, head_dim, scaling): t [.., S, head_dim] (every leading index the same "
                "slice; S = 1 holds position 0 alone, named theta 10000) is the cos (kind 'cos') or sin ('sin') "
                "table of RoPE at positions 0..S-1 (rope_tables: frequencies rope_inv_freq(theta, head_dim, "
                "scaling), scaling the JSON of None or ('linear', factor)), within table_tolerance(S)")
def _rope_table(value: np.ndarray, ty: TensorType):
    if ty.dtype is not DType.F32 or ty.rank < 2:
        return None
    t = uniform_leading(value, 2)
    if t is None:
        return None
    rows, d = t.shape
    half = d // 2
    if d < 2 or d % 2 or not np.array_equal(t[:, :half], t[:, half:]):
        return None
    tol = table_tolerance(rows)
    if np.abs(t[0] - 1).max() <= tol:
        kind, inverse = "cos", np.arccos
    elif np.abs(t[0]).max() <= tol:
        kind, inverse = "sin", np.arcsin
    else:
        return None
    if rows == 1:  # position 0 alone: no rotation, whatever theta (one is named)
        return kind, 10000.0, d, json.dumps(None)
    freqs = inverse(np.clip(t[1, :half], -1.0, 1.0))  # the angles at position 1: the frequencies (all <= 1)
    if freqs[0] <= 0:
        return None
    factor = 1.0 / freqs[0]
    scaling = None if abs(factor - 1) <= 1e-4 else ("linear", float(f"{factor:.6g}"))
    measured = (freqs[1] / freqs[0]) ** (-d / 2) if half > 1 and freqs[1] > 0 else 10000.0
    for theta in _snapped(float(measured)):
        cos, sin = rope_tables(rows, theta, d, scaling)
        if np.abs((cos if kind == "cos" else sin) - t).max() <= tol:
            return kind, theta, d, json.dumps(scaling)
    return None


# --- the rule ----------------------------------------------------------------------------------


def _rope_example(table_first: bool, sin_first: bool, axis: int, scaling=None):
    def build(g, dim):
        b, s, h, half = dim("b", 1, 2), dim("s", 2, 5), dim("h", 1, 3), dim("half", 1, 3)
        d = 2 * half
        rows = g.input("x", [b * s, h * d])
        x = g.add_node("Permute", (g.reshape(rows, [b, s, h, d]),), perm=_HEADS)
        cos, sin = rope_tables(s, 500.0, d, scaling)
        c = g.constant(cos.astype(np.float32), shape=[1, 1, s, d])
        sn = g.constant(sin.astype(np.float32), shape=[1, 1, s, d])
        lo = g.add_node("Slice", (x,), starts=[0], ends=[half], axes=[3], steps=[1])
        hi = g.add_node("Slice", (x,), starts=[half], ends=[d], axes=[axis], steps=[1])
        rot = g.concat([g.neg(hi), lo], axis=3)
        a = g.mul(c, x) if table_first else g.mul(x, c)
        r = g.mul(rot, sn)
        g.set_outputs([g.add(r, a) if sin_first else g.add(a, r)])

    return build


@rules("attention")
def _rope_of_head_split_rows(e):
    y, c, sn = e.vars("y c sn")
    sv, sc = e.vars("sv sc", e.Vec[e.i64])
    (theta,) = e.vars("theta", e.f64)
    (hd,) = e.vars("hd", e.i64)
    (scaling,) = e.vars("scaling", e.String)
    heads = e.Vec(*(e.i64(i) for i in _HEADS))
    view = e.Identity(y, shape=sv)  # [B, S, H, D]
    x = e.Permute(view, perm=heads)
    half = sv[3] / e.i64(2)
    rows = e.Identity(view, shape=e.Vec(sv[0] * sv[1], sv[2] * sv[3]))
    rope = e.RoPE(rows, theta=theta, head_dim=hd, pos_offset=e.i64(0), pairing=e.String("half"), batch=sv[0],
                  scaling=scaling)
    split = e.Identity(rope, shape=sv)
    tables = (e.rope_table(c, e.String("cos"), theta, hd, scaling),
              e.rope_table(sn, e.String("sin"), theta, hd, scaling),
              e.eq(e.shape(view)).to(sv), e.eq(sv.length()).to(e.i64(4)), e.eq(hd).to(sv[3]),
              e.eq(e.shape(c)).to(sc), e.eq(sc[sc.length() - e.i64(2)]).to(sv[1]))
    # Mul(c, x) -> Mul(x, c)   for a RoPE table c: the order the rule below reads
    yield e.equal("Mul(cos, x) -> Mul(x, cos) (a RoPE table)", e.Mul(c, x), e.Mul(x, c), tables[0], *tables[2:],
                  example=example(_rope_example(True, False, 3)))
    # Add(Mul(x, cos), Mul(Concat(Neg(x[.., D/2:]), x[.., :D/2]), sin)) -> Permute(Reshape(RoPE(rows), [B,S,H,D]), .)
    #   x = Permute(Reshape(rows, [B,S,H,D]), [0,2,1,3]); cos and sin tables of one theta, head_dim D, S positions;
    #   the slices on axis 3 (a slice on axis -1 is one on axis 3 too: movement.py)
    def part(start, end):
        return e.Slice(x, starts=e.Vec(start), ends=e.Vec(end), axes=e.Vec(e.i64(3)), steps=e.Vec(e.i64(1)))

    rot = e.Concat(e.Neg(part(half, sv[3])), part(e.i64(0), half), axis=e.i64(3))
    for sin_first in (False, True):
        terms = (e.Mul(rot, sn), e.Mul(x, c)) if sin_first else (e.Mul(x, c), e.Mul(rot, sn))
        lhs = e.Add(*terms)
        yield e.rule(lhs, *tables,
                     name=f"Add({'rotate_half(x) sin, x cos' if sin_first else 'x cos, rotate_half(x) sin'}) -> "
                          "RoPE(rows)",
                     example=example(_rope_example(False, sin_first, 3))).then(
            e.union(lhs).with_(e.Permute(split, perm=heads)),
            e.set_(e.shape(rows)).to(e.Vec(sv[0] * sv[1], sv[2] * sv[3])),
            e.set_(e.shape(rope)).to(e.Vec(sv[0] * sv[1], sv[2] * sv[3])), e.set_(e.shape(split)).to(sv))
