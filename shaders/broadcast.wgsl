//#include "common.wgsl"
//#include "coords.wgsl"
// out[i] = EXPR of the operands' elements `av`, `bv`, `cv` with numpy broadcasting
// (ir/ops/broadcasting.py, broadcast_kernel). LOADS reads each operand: at i when it is laid
// out as the output, at 0 when it is one element, else through per-dimension element strides
// (0 on broadcast dimensions) over the output's merged dimensions: `dims` (rank <= 4, leading
// 1s), or `dims_hi` then `dims` (rank <= 8; `inner` is the product of `dims`).
// 256 elements per workgroup.
{{HELPERS}}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
{{LOADS}}
    out[i] = {{EXPR}};
}
