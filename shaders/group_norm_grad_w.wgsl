//#include "common.wgsl"
//#include "reduce.wgsl"
// GroupNormGradWeight (ir/ops/norms.py): dw[c] = sum_{n,s} dy[n,c,s] xhat[n,c,s] for
// x [N, C, S], xhat normalised per (sample, group) as group_norm.wgsl does. One workgroup
// per channel: for each sample in order it recomputes the statistics of the channel's
// group (two passes over its (C/G) * S elements), then adds dy * xhat over the channel's S
// positions into per-invocation sums, reduced once at the end. Every channel of a group
// recomputes the same statistics, so x is read about 2 * C/G + 1 times in all.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let ch = linear_workgroup(wid, nwg);
    if (ch >= p.channels) {
        return;
    }
    let len = p.cpg * p.s;
    let n = f32(len);
    var acc = 0.0;
    for (var smp = 0u; smp < p.samples; smp = smp + 1u) {
        let base = smp * p.channels * p.s + (ch / p.cpg) * len;
        let x0 = x[base];  // centre about it, as norm_grad_x.wgsl
        var s = 0.0;
        for (var e = li; e < len; e = e + RED) {
            s = s + (x[base + e] - x0);
        }
        let mean = workgroup_sum(li, s) / n;  // of x - x0
        var q = 0.0;
        for (var e = li; e < len; e = e + RED) {
            let d = (x[base + e] - x0) - mean;
            q = q + d * d;
        }
        let rstd = 1.0 / sqrt(workgroup_sum(li, q) / n + p.eps);
        let cb = (smp * p.channels + ch) * p.s;
        for (var e = li; e < p.s; e = e + RED) {
            acc = acc + dy[cb + e] * ((x[cb + e] - x0) - mean) * rstd;
        }
    }
    let total = workgroup_sum(li, acc);
    if (li == 0u) {
        out[ch] = total;
    }
}
