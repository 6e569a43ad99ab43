//#include "common.wgsl"
// SwiGLUConcat: out[i, j] = silu(x[i, j]) * x[i, N + j] for x [M, 2N], the gate and up
// projections packed side by side (Shazeer 2020; ir/ops/elementwise.py). One output
// element per invocation, 256 per workgroup.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    let gate = (i / p.half) * 2u * p.half + i % p.half;
    out[i] = silu(x[gate]) * x[gate + p.half];
}
