//#include "derivatives.wgsl"
// Elementwise gradients, out[i] = EXPR of g = dy[i] and v = x[i] (the forward input): the
// <Op>Grad ops, SwiGLUGradGate (which also reads up[i]) and SwiGLUGradUp
// (lowering/kernels_backward.py, GRAD_WGSL). Template slots: INPUTS (dy, x and, for
// SwiGLUGradGate, up), EXPR, OUT and UNIFORM. 256 elements per workgroup.

struct Params {
    n: u32,  // elements
}

{{INPUTS}}
@group(0) @binding({{OUT}}) var<storage, read_write> out: array<f32>;
@group(0) @binding({{UNIFORM}}) var<uniform> p: Params;

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
