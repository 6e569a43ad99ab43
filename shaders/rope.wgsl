//#include "rope_rotate.wgsl"
// RoPE and RoPEGrad (ir.ops): one invocation per rotated pair, positions from the uniform's
// pos_offset (see rope_rotate.wgsl).

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let q = linear_workgroup(wid, nwg) * 256u + li;
    if (q >= p.n) {
        return;
    }
    rotate_pair(q, p.pos_offset, 0u);
}
