//#include "common.wgsl"
// out[i] = f(x[i]) for a unary elementwise op; EXPR is f applied to `v`
// (the unary table of ir/ops/elementwise.py). 256 elements per workgroup.

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
