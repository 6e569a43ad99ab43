// attention.wgsl hooks without RoPE: the query row is loaded as it is, a score is the
// plain dot product with the key row.

fn load_q(qv: ptr<function, array<f32, HD>>, q_base: u32, row: u32) {
    for (var d = 0u; d < HD; d = d + 1u) {
        (*qv)[d] = {{Q}}[q_base + d];
    }
}

fn qk_dot(qv: ptr<function, array<f32, HD>>, kv_base: u32, row: u32) -> f32 {
    var s = 0.0;
    for (var d = 0u; d < HD; d = d + 1u) {
        s = s + (*qv)[d] * {{K}}[kv_base + d];
    }
    return s;
}
