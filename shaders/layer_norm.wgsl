//#include "common.wgsl"
//#include "reduce.wgsl"
// LayerNorm over rows of N (the last axis): (x - mean) / sqrt(var + eps) * w + b with the biased
// variance computed in a second pass over (x - mean) (Ba et al. 2016; ir/ops/norms.py). Every pass
// works on x - x[row, 0] (exact for the elements near x[row, 0]) and its mean m, never rounding
// x[0] + m back to one float: a row of a large mean and a small spread keeps its low bits (summed
// directly, rows of mean 1000 and spread 0.01 over 768 elements came out 2.2e-2 off float64);
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
    let m = workgroup_sum(li, s) / f32(p.n);  // mean - shift
    var q = 0.0;
    for (var j = li; j < p.n; j = j + RED) {
        let d = (x[base + j] - shift) - m;
        q = q + d * d;
    }
    let rstd = 1.0 / sqrt(workgroup_sum(li, q) / f32(p.n) + p.eps);
    for (var j = li; j < p.n; j = j + RED) {
        out[base + j] = ((x[base + j] - shift) - m) * rstd * {{W}} + {{B}};
    }
}
