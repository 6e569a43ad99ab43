// reduce.wgsl's workgroup_sum and workgroup_max over RED invocations, with subgroup
// operations (subgroup_reduce.wgsl); lowering includes this file in place of reduce.wgsl
// when the device has usable subgroups. Same contract: uniform control flow only, the
// result valid in every invocation.
//#include "subgroup_reduce.wgsl"
const RED: u32 = 256u;

fn workgroup_sum(li: u32, v: f32) -> f32 {
    return sg_workgroup_sum(li, v, RED);
}

fn workgroup_max(li: u32, v: f32) -> f32 {
    return sg_workgroup_max(li, v, RED);
}
