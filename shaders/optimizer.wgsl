//#include "common.wgsl"
// In-place optimiser updates (ir/ops/optimisers.py): one invocation per element of the
// parameter. The written buffer is bound last, read_write. UPDATE is the WGSL of one op;
// the uniform holds n (elements) and the op's hyperparameters by name.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
{{UPDATE}}
}
