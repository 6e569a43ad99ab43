//#include "common.wgsl"
//#include "reduce.wgsl"
// RmsNorm over rows of N (the last axis): x / sqrt(mean(x^2) + eps) * w (Zhang & Sennrich 2019;
// ir/ops/norms.py); W is the weight read, or 1.0 for a norm without one. One workgroup
// per row.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = linear_workgroup(wid, nwg);
    if (row >= p.rows) {
        return;
    }
    let base = row * p.n;
    var q = 0.0;
    for (var j = li; j < p.n; j = j + RED) {
        let v = x[base + j];
        q = q + v * v;
    }
    let rstd = 1.0 / sqrt(workgroup_sum(li, q) / f32(p.n) + p.eps);
    for (var j = li; j < p.n; j = j + RED) {
        out[base + j] = x[base + j] * rstd * {{W}};
    }
}
