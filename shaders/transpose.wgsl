//#include "common.wgsl"
// out[C,R] = x[R,C]^T, one output element per invocation, 256 per workgroup.

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
