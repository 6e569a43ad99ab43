//#include "common.wgsl"
// out[i] = f(x[i]) for a unary elementwise op; EXPR is f applied to `v`
// (lowering/kernels.py, UNARY_WGSL). 256 elements per workgroup.

struct Params {
    n: u32,  // elements
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    let v = x[i];
    out[i] = {{EXPR}};
}
