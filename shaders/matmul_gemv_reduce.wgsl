//#include "matmul_gemv_tree.wgsl"
// matmul_gemv.wgsl's reductions in workgroup memory. Uniform control flow only. Devices with
// usable subgroups get matmul_gemv_reduce_subgroup.wgsl instead (lowering.wgsl.SUBGROUP_FORMS).

// The sum of v over the LANES lanes of an invocation's column, valid in lane 0.
fn lanes_sum(li: u32, lane: u32, stride: u32, v: vec4<f32>) -> vec4<f32> {
    return lanes_tree(li, lane, stride, v);
}
