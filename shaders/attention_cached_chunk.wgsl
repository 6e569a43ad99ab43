// attention_cached.wgsl's reductions over one chunk of WG keys, in workgroup memory: every
// invocation reads all WG scores (then weights) from weight[]. Uniform control flow only.

// The max of the chunk's scores (s of every invocation).
fn chunk_max(li: u32, s: f32) -> f32 {
    weight[li] = s;
    workgroupBarrier();
    var mt = MAX_INIT;
    for (var i = 0u; i < WG; i = i + 1u) {
        mt = max(mt, weight[i]);
    }
    workgroupBarrier();  // every max is taken before the weights overwrite the scores
    return mt;
}

// The sum of the chunk's weights, each invocation's already stored in weight[li].
fn chunk_sum(li: u32, w: f32) -> f32 {
    workgroupBarrier();
    var lt = 0.0;
    for (var i = 0u; i < WG; i = i + 1u) {
        lt = lt + weight[i];
    }
    return lt;
}
