//#include "common.wgsl"
//#include "reduce.wgsl"
// LayerNorm over rows of N (the last axis): (x - mean) / sqrt(var + eps) * w + b with the biased
// variance computed in a second pass over (x - mean) (Ba et al. 2016; ir/ops/norms.py); the mean is
// the row's first element plus the mean of x - x[0], so that a row of a large mean and a small spread
// keeps its mean's low bits (summed directly, a mean of 1000 over 768 elements was 1e-4 off);
// W and B are the weight and bias reads, or 1.0 and 0.0 for a norm without them.
// One workgroup per row.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = linear_workgroup(wid, nwg);
    if (row >= p.rows) {
        return;
    }
    let base = row * p.n;
    let shift = x[base];
    var s = 0.0;
    for (var j = li; j < p.n; j = j + RED) {
        s = s + (x[base + j] - shift);
    }
    let mean = shift + workgroup_sum(li, s) / f32(p.n);
    var q = 0.0;
    for (var j = li; j < p.n; j = j + RED) {
        let d = x[base + j] - mean;
        q = q + d * d;
    }
    let rstd = 1.0 / sqrt(workgroup_sum(li, q) / f32(p.n) + p.eps);
    for (var j = li; j < p.n; j = j + RED) {
        out[base + j] = (x[base + j] - mean) * rstd * {{W}} + {{B}};
    }
}
