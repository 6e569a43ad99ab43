//#include "conv_common.wgsl"
//#include "gemm_tiled.wgsl"
// Conv / ConvTranspose as an implicit GEMM (ir/ops/conv.py) through the tiled kernel of
// gemm_tiled.wgsl: for image nb and group grp (z = nb * groups + grp), C[m, q] = sum_k
// W(m, k) X(k, q) with m < M/group the group's output channel, q < od * oh * ow the output
// position, k = c * taps + tap over the group's input channels and the kernel taps; X(k, q)
// is the input that position q reads through tap (0 in the padding), gathered as it is
// staged (no im2col buffer). POINTWISE (a 1x1x1 kernel, stride 1, no padding: X(k, q) is
// channel k at position q) skips the gather. UNPOOL, a ConvTranspose whose kernel equals its
// stride (no padding, dilation or output padding), is the GEMM C[(m, tap), q] = sum_c W[c, m,
// tap] X[c, q] over the input positions q instead (A = the group's weight as [C/group,
// M/group * taps], transposed), each result stored at output q * stride + tap, which no other
// tap writes. The store applies the epilogue (conv_common.wgsl: the bias, or a fused chain).

const POINTWISE: bool = {{POINTWISE}};
const UNPOOL: bool = {{UNPOOL}};

var<private> nb: u32;
var<private> grp: u32;
var<private> col0: u32;
var<private> oc: array<vec3<u32>, 4>;  // output positions of the 4 columns this invocation stages

fn gemm_begin(z: u32, col: u32) {
    nb = z / p.chan.z;
    grp = z % p.chan.z;
    col0 = col;
    for (var e = 0u; e < 4u; e = e + 1u) {
        oc[e] = out_coord(min(col + e, p.n - 1u));
    }
}

fn load_a(m: u32, k: u32) -> f32 {
    if (UNPOOL) {
        return w[(grp * p.chan.x + k) * p.m + m];
    }
    if (TRANSPOSED) {
        return w[weight_at(grp, m, k / TAPS, k % TAPS)];
    }
    return w[(grp * p.chan.y + m) * p.k + k];
}

fn load_b4(k: u32) -> vec4<f32> {
    var v = vec4<f32>();
    let ch = grp * p.chan.x + select(k / TAPS, k, UNPOOL);
    if (POINTWISE || UNPOOL) {
        let base = (nb * p.ins.w + ch) * p.n;
        for (var e = 0u; e < 4u; e = e + 1u) {
            if (col0 + e < p.n) {
                v[e] = x[base + col0 + e];
            }
        }
        return v;
    }
    let tap = k % TAPS;
    let tw = tap % KW;
    let th = (tap / KW) % KH;
    let td = tap / (KW * KH);
    let plane = (nb * p.ins.w + ch) * p.ins.x;
    for (var e = 0u; e < 4u; e = e + 1u) {
        let id = tap_at(oc[e].x, td, p.ins.x, p.stride.x, p.pad.x, p.dil.x);
        let ih = tap_at(oc[e].y, th, p.ins.y, p.stride.y, p.pad.y, p.dil.y);
        let iw = tap_at(oc[e].z, tw, p.ins.z, p.stride.z, p.pad.z, p.dil.z);
        if (col0 + e < p.n && id >= 0 && ih >= 0 && iw >= 0) {
            v[e] = x[((plane + u32(id)) * p.ins.y + u32(ih)) * p.ins.z + u32(iw)];
        }
    }
    return v;
}

// Output (m, n): image nb, channel grp * M/group + m, position n; UNPOOL: row m = (channel,
// tap (td, th, tw)), input position n = (qd, qh, qw), output position n * stride + tap, split
// into the row's part (channel and tap) and the column's (n * stride).
fn out_row(m: u32) -> u32 {
    if (UNPOOL) {
        let o = grp * p.chan.y + m / TAPS;
        let tap = m % TAPS;
        let t = vec3<u32>(tap / (KW * KH), (tap / KW) % KH, tap % KW);
        return (((nb * p.outs.w + o) * p.outs.x + t.x) * p.outs.y + t.y) * p.outs.z + t.z;
    }
    return (nb * p.outs.w + grp * p.chan.y + m) * p.n;
}

fn out_col(n: u32) -> u32 {
    if (UNPOOL) {
        let q = vec3<u32>(n / (p.ins.y * p.ins.z), (n / p.ins.z) % p.ins.y, n % p.ins.z) * p.stride.xyz;
        return (q.x * p.outs.y + q.y) * p.outs.z + q.z;
    }
    return n;
}

fn finish(m: u32, at: u32, v: f32) -> f32 {
    return conv_epilogue(grp * p.chan.y + select(m, m / TAPS, UNPOOL), at, v);
}
