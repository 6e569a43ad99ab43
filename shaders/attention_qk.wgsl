// attention.wgsl hooks without RoPE: the query row is loaded as it is, the K tile is
// used as loaded.

fn load_q(qv: ptr<function, array<vec4<f32>, HD4>>, q_base: u32, row: u32) {
    for (var c = 0u; c < HD4; c = c + 1u) {
        (*qv)[c] = {{Q}}4(q_base, c);
    }
}

fn prepare_k_tile(li: u32, k0: u32, nk: u32) {
}
