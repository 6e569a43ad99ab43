//#include "rope_rotate.wgsl"
// RoPE and RoPEGrad (ir/ops/transformer.py): one invocation per rotated pair, positions from the uniform's
// pos_offset (see rope_rotate.wgsl).

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let q = linear_workgroup(wid, nwg) * 256u + li;
    if (q >= p.n) {
        return;
    }
    rotate_pair(q, p.pos_offset, 0u);
}
