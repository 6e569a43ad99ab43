//#include "common.wgsl"
//#include "arith.wgsl"
//#include "derivatives.wgsl"
// (arith and derivatives: the helpers of generated epilogue regions, ir/ops/fused_epilogue.py)
// Shared by conv_direct.wgsl and conv_gemm.wgsl (Conv, ConvTranspose; ir/ops/conv.py): the
// geometry of one convolution over up to 3 spatial axes (d, h, w; fewer axes are padded with
// size-1 ones). Uniform: p.ins = (in d, h, w, C), p.outs = (out d, h, w, M), p.ker =
// (kernel d, h, w, taps; also the constants KD, KH, KW), p.stride, p.dil, p.pad (begin pads, i32), p.chan = (C per group,
// M per group, groups, batch). x is [N, C, d, h, w]; the weight is [M, C/group, taps] (Conv)
// or [C, M/group, taps] (ConvTranspose); out is [N, M, d, h, w]. EPILOGUE is applied to each
// output value v of channel o stored at out[at], reading the operands e0, e1, ...: the bias
// of a Conv / ConvTranspose (nothing without one), or the chain of FusedConv / FusedConvBn
// (ir/ops/conv_fused.py).

const TRANSPOSED: bool = {{TRANSPOSED}};
// The kernel's extent, template constants: the compiler unrolls loops over them and turns
// divisions by them into multiplications.
const KD: u32 = {{KD}}u;
const KH: u32 = {{KH}}u;
const KW: u32 = {{KW}}u;
const TAPS: u32 = KD * KH * KW;

// The input coordinate that output coordinate o reads through kernel tap t along an axis of
// n_in inputs, or -1 when there is none. Conv: i = o s + t d - pad, inside [0, n_in).
// ConvTranspose (the adjoint): the i with i s + t d - pad = o, if it is an integer inside.
fn tap_at(o: u32, t: u32, n_in: u32, s: u32, pad: i32, d: u32) -> i32 {
    if (TRANSPOSED) {
        let q = i32(o) + pad - i32(t * d);
        if (q < 0 || u32(q) % s != 0u) {
            return -1;
        }
        let i = u32(q) / s;
        return select(-1, i32(i), i < n_in);
    }
    let i = i32(o * s + t * d) - pad;
    if (i < 0 || u32(i) >= n_in) {
        return -1;
    }
    return i;
}

// The first kernel tap along an axis that can reach output coordinate o, and the step to the
// next: every tap for Conv; for ConvTranspose without dilation only the taps t = o + pad
// (mod s) (the others land between input positions), so a direct loop skips them.
fn tap_first(o: u32, s: u32, pad: i32, d: u32) -> u32 {
    if (TRANSPOSED && d == 1u) {
        let r = (i32(o) + pad) % i32(s);
        return u32(select(r, r + i32(s), r < 0));
    }
    return 0u;
}

fn tap_step(s: u32, d: u32) -> u32 {
    return select(1u, s, TRANSPOSED && d == 1u);
}

// The weight element linking output channel m of group grp to input channel c of the group at tap.
fn weight_at(grp: u32, m: u32, c: u32, tap: u32) -> u32 {
    if (TRANSPOSED) {
        return ((grp * p.chan.x + c) * p.chan.y + m) * TAPS + tap;
    }
    return ((grp * p.chan.y + m) * p.chan.x + c) * TAPS + tap;
}

fn conv_epilogue(o: u32, at: u32, acc: f32) -> f32 {
    var v = acc;
{{EPILOGUE}}
    return v;
}

// The spatial output coordinate (d, h, w) of flat position q < od * oh * ow.
fn out_coord(q: u32) -> vec3<u32> {
    return vec3<u32>(q / (p.outs.y * p.outs.z), (q / p.outs.z) % p.outs.y, q % p.outs.z);
}
