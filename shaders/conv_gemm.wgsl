//#include "conv_common.wgsl"
//#include "gemm_tiled.wgsl"
// Conv / ConvTranspose as an implicit GEMM (ir/ops/conv.py) through the tiled kernel of
// gemm_tiled.wgsl: for image nb and group grp (z = nb * groups + grp), C[m, q] = sum_k
// W(m, k) X(k, q) with m < M/group the group's output channel, q < od * oh * ow the output
// position, k = c * taps + tap over the group's input channels and the kernel taps; X(k, q)
// is the input that position q reads through tap (0 in the padding), gathered as it is
// staged (no im2col buffer). POINTWISE (a 1x1x1 kernel, stride 1, no padding: X(k, q) is
// channel k at position q) skips the gather. The store adds the bias.

const POINTWISE: bool = {{POINTWISE}};

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
    if (TRANSPOSED) {
        return w[weight_at(grp, m, k / p.ker.w, k % p.ker.w)];
    }
    return w[(grp * p.chan.y + m) * p.k + k];
}

fn load_b4(k: u32) -> vec4<f32> {
    var v = vec4<f32>();
    let ch = grp * p.chan.x + k / p.ker.w;
    if (POINTWISE) {
        let base = (nb * p.ins.w + ch) * p.n;
        for (var e = 0u; e < 4u; e = e + 1u) {
            if (col0 + e < p.n) {
                v[e] = x[base + col0 + e];
            }
        }
        return v;
    }
    let tap = k % p.ker.w;
    let tw = tap % p.ker.z;
    let th = (tap / p.ker.z) % p.ker.y;
    let td = tap / (p.ker.z * p.ker.y);
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

fn store_c(m: u32, n: u32, v: f32) {
    let o = grp * p.chan.y + m;
    out[(nb * p.outs.w + o) * p.n + n] = v + bias_at(o);
}
