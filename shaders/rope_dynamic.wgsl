//#include "rope_rotate.wgsl"
// RoPEDynamic (ir/ops/kv_cache.py): one invocation per rotated pair; row r has position
// offset[0] + r, the offset read from an input at run time, so one pipeline and bind group
// serve every decoding step (see rope_rotate.wgsl; the uniform's pos_offset is 0).

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let q = linear_workgroup(wid, nwg) * 256u + li;
    if (q >= p.n) {
        return;
    }
    rotate_pair(q, f32(offset[0]), 0u);
}
