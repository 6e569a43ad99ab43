//#include "common.wgsl"
//#include "reduce.wgsl"
// GroupNorm and GroupNormSilu on x [N, C, S] (Wu & He 2018; ir/ops/norms.py): one
// workgroup per (sample, group), whose C/G channels x S positions are contiguous. The
// mean comes first, then the biased variance from a second pass over (x - mean), which
// has none of the cancellation of E[x^2] - E[x]^2; a third pass writes
// ACT((x - mean) * rstd * w[c] + b[c]). Template slot ACT: `v`, or `silu(v)`.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let grp = linear_workgroup(wid, nwg);
    if (grp >= p.groups) {
        return;
    }
    let base = grp * p.len;  // (n * G + g) * (C / G) * S = n * C * S + g * (C / G) * S
    let c0 = (grp % p.g) * p.cpg;
    var s = 0.0;
    for (var e = li; e < p.len; e = e + RED) {
        s = s + x[base + e];
    }
    let mean = workgroup_sum(li, s) / f32(p.len);
    var q = 0.0;
    for (var e = li; e < p.len; e = e + RED) {
        let d = x[base + e] - mean;
        q = q + d * d;
    }
    let rstd = 1.0 / sqrt(workgroup_sum(li, q) / f32(p.len) + p.eps);
    for (var e = li; e < p.len; e = e + RED) {
        let c = c0 + e / p.s;
        let v = (x[base + e] - mean) * rstd * w[c] + bias[c];
        out[base + e] = {{ACT}};
    }
}
