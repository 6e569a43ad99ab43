// attention_cached_chunk.wgsl with subgroup operations (subgroup_reduce.wgsl): the chunk's
// max and sum without a pass of every invocation over weight[]. Uniform control flow only.
//#include "subgroup_reduce.wgsl"

fn chunk_max(li: u32, s: f32) -> f32 {
    return sg_workgroup_max(li, s, WG);
}

// The sum of the chunk's weights; its barriers also order the weight[li] stores before
// the second phase reads them.
fn chunk_sum(li: u32, w: f32) -> f32 {
    return sg_workgroup_sum(li, w, WG);
}
