//#include "common.wgsl"
// LRN, local response normalisation across channels (ir/ops/axis_norms.py; Krizhevsky et
// al. 2012): element (n, c, s) of x viewed as [N, C, S] becomes
// x / (bias + alpha / size * sum of x[n, c', s]^2)^beta over the channels
// c - lo <= c' <= c + hi (clipped to [0, C)), lo = floor((size - 1) / 2),
// hi = ceil((size - 1) / 2). 256 elements per workgroup.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    let c = (i / p.spatial) % p.channels;
    let line = i - c * p.spatial;  // element (n, 0, s)
    let first = select(0u, c - p.lo, c >= p.lo);
    let last = min(p.channels - 1u, c + p.hi);
    var q = 0.0;
    for (var k = first; k <= last; k = k + 1u) {
        let v = x[line + k * p.spatial];
        q = q + v * v;
    }
    out[i] = x[i] / pow(p.bias + p.alpha / f32(p.size) * q, p.beta);
}
