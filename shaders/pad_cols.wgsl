//#include "common.wgsl"
// PadCols (ir/ops/shape.py), the adjoint of SliceCols: out[i, start + j] = x[i, j] for
// x [rows, cols], zero in the other columns of out [rows, width]. One output element per
// invocation, 256 per workgroup.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    let c = i % p.width;
    var v = 0.0;
    if (c >= p.start && c < p.start + p.cols) {
        v = x[(i / p.width) * p.cols + c - p.start];
    }
    out[i] = v;
}
