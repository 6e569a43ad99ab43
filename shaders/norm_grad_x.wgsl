//#include "common.wgsl"
//#include "reduce.wgsl"
// Input gradients of the norms (ir/ops/norms.py: LayerNormGradX, RmsNormGradX,
// GroupNormGradInput) over segments of `len` contiguous elements, one workgroup each:
// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy * w[c], xhat = (x - mean) rstd,
// rstd = 1 / sqrt(mean((x - mean)^2) + eps), means over the segment (the LayerNorm
// backward, e.g. Ba et al. 2016). With CENTERED false, mean and mean(g) are 0: that is
// RmsNormGradX, r (g - xhat mean(g xhat)) with xhat = x r. A row of a LayerNorm/RmsNorm
// is one segment of one group (cpg = len, s = 1, so c = the column); a GroupNorm segment
// is the (sample, group) block of cpg channels x s positions, channel c0 + e / s.
// The variance is a second pass over (x - mean), as layer_norm.wgsl, and x is centred as
// (x - x0) - mean(x - x0) with x0 the segment's first element: x - x0 is exact for nearby
// values, so inputs far from 0 (1000 + noise) lose nothing to the rounding of a large mean,
// an error every sum of dy * xhat would multiply.

const CENTERED: bool = {{CENTERED}};

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let seg = linear_workgroup(wid, nwg);
    if (seg >= p.segs) {
        return;
    }
    let base = seg * p.len;
    let c0 = (seg % p.g) * p.cpg;
    let n = f32(p.len);
    let x0 = select(0.0, x[base], CENTERED);
    var mean = 0.0;  // of x - x0
    if (CENTERED) {
        var s = 0.0;
        for (var e = li; e < p.len; e = e + RED) {
            s = s + (x[base + e] - x0);
        }
        mean = workgroup_sum(li, s) / n;
    }
    var q = 0.0;
    for (var e = li; e < p.len; e = e + RED) {
        let d = (x[base + e] - x0) - mean;
        q = q + d * d;
    }
    let rstd = 1.0 / sqrt(workgroup_sum(li, q) / n + p.eps);
    var sg = 0.0;
    var sgx = 0.0;
    for (var e = li; e < p.len; e = e + RED) {
        let g = dy[base + e] * w[c0 + e / p.s];
        sg = sg + g;
        sgx = sgx + g * ((x[base + e] - x0) - mean) * rstd;
    }
    var mg = 0.0;
    if (CENTERED) {
        mg = workgroup_sum(li, sg) / n;
    }
    let mgx = workgroup_sum(li, sgx) / n;
    for (var e = li; e < p.len; e = e + RED) {
        let g = dy[base + e] * w[c0 + e / p.s];
        let xhat = ((x[base + e] - x0) - mean) * rstd;
        out[base + e] = rstd * (g - mg - xhat * mgx);
    }
}
