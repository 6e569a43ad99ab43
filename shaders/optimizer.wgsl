//#include "common.wgsl"
// In-place optimiser updates (ir/ops_train.py): one invocation per element of the
// parameter. The written buffer is bound last, read_write; READS declares the others.
// UPDATE is the WGSL of one op (lowering/kernels_train.py).

struct Params {
    n: u32,      // elements of the parameter
    a: f32,      // lr, momentum or beta1
    b: f32,      // weight decay or beta2
    c: f32,      // beta1 (AdamStep)
    d: f32,      // beta2 (AdamStep)
    e: f32,      // eps (AdamStep)
    f: f32,      // weight decay (AdamStep)
}

{{BINDINGS}}
@group(0) @binding({{UNIFORM}}) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
{{UPDATE}}
}
