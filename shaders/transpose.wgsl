//#include "common.wgsl"
// out[C,R] = x[R,C]^T, one output element per invocation, 256 per workgroup.

struct Params {
    rows: u32,  // R, rows of x
    cols: u32,  // C, columns of x
    n: u32,     // R * C
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
    let c = i / p.rows;  // output row = input column
    let r = i % p.rows;
    out[i] = x[r * p.cols + c];
}
