//#include "common.wgsl"
//#include "coords.wgsl"
//#include "arith.wgsl"
//#include "derivatives.wgsl"
// A generated elementwise kernel: one region of broadcasting elementwise ops (the Fused op,
// ir/ops/fused.py), one invocation per output element. LOADS reads each input of the region
// with numpy broadcasting to the output (as broadcast.wgsl: at i, at 0, or through element
// strides over the output's merged dimensions `dims` / `dims_hi`), then computes the region's
// steps in order, each a `let` of its dtype's WGSL type built from the same expressions the
// single-op kernels use (the POINTWISE and unary tables). RESULT is the last step.
// 256 elements per workgroup.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
{{LOADS}}
    out[i] = {{RESULT}};
}
