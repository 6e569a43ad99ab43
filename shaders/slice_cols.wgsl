//#include "common.wgsl"
// SliceCols: out[i, j] = x[i, start + j] for x [rows, cols], j < size (ir/ops/shape.py).
// One output element per invocation, 256 per workgroup; x and out are f32 or u32
// (elements are copied, never converted).

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    out[i] = x[(i / p.size) * p.cols + p.start + i % p.size];
}
