//#include "common.wgsl"
// Shared by attention_window*.wgsl (SlidingWindowAttention, CrossAttention and their
// gradients): the head size, the uniform and the key range of a query row.
// Template slots of the including kernels: HEAD_DIM; KEPT (key_mask [batch, kv_seq] > 0
// keeps key j of sequence b, or `true`).

const HD: u32 = {{HEAD_DIM}}u;

// Keys [x, y) query row qi attends to (ir/ops/attention.py attention_band).
fn key_range(qi: u32) -> vec2<u32> {
    if (p.window == 0u) {
        return vec2<u32>(0u, p.kv_seq);
    }
    let hi = qi + 1u;
    return vec2<u32>(hi - min(hi, p.window), hi);
}

// Query rows [x, y) that attend to key row kj: the transpose of key_range.
fn query_range(kj: u32) -> vec2<u32> {
    if (p.window == 0u) {
        return vec2<u32>(0u, p.q_seq);
    }
    return vec2<u32>(min(kj, p.q_seq), min(p.q_seq, kj + p.window));
}
