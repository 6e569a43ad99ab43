//#include "common.wgsl"
// Trilu (ir/ops/movement.py): out = x where KEEP holds for the element's row r and column c
// (the last two axes, p.rows x p.cols), zero (false) elsewhere; KEEP is c - r >= k (upper)
// or c - r <= k (lower). One element per invocation, 256 per workgroup.
// Template slots: T (the element type), KEEP.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    let c = i32(i % p.cols);
    let r = i32((i / p.cols) % p.rows);
    out[i] = select(bitcast<{{T}}>(0u), x[i], {{KEEP}});
}
