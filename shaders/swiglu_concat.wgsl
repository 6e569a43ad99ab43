//#include "common.wgsl"
// SwiGLUConcat: out[i, j] = silu(x[i, j]) * x[i, N + j] for x [M, 2N], the gate and up
// projections packed side by side (Shazeer 2020; ir.ops_fused SwiGLUConcat). One output
// element per invocation, 256 per workgroup.

struct Params {
    n: u32,     // output elements, M * N
    half: u32,  // N
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

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
