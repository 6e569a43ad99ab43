//#include "derivatives.wgsl"
// Elementwise gradients, out[i] = EXPR of g = dy[i] and v = x[i] (the forward input): the
// <Op>Grad ops of the unary table, SwiGLUGradGate (which also reads up[i]) and SwiGLUGradUp
// (ir/ops/elementwise.py). Template slot: EXPR. 256 elements per workgroup.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    let g = dy[i];
    let v = x[i];
    out[i] = {{EXPR}};
}
