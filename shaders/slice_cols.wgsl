//#include "common.wgsl"
// SliceCols: out[i, j] = x[i, start + j] for x [rows, cols], j < size (ir.ops_fused
// SliceCols). One output element per invocation, 256 per workgroup. Template slot T
// (f32 or u32; elements are copied, never converted).

struct Params {
    n: u32,      // output elements, rows * size
    size: u32,   // output columns
    cols: u32,   // input columns
    start: u32,  // first input column
}

@group(0) @binding(0) var<storage, read> x: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    out[i] = x[(i / p.size) * p.cols + p.start + i % p.size];
}
