// attention.wgsl hooks without RoPE: the Q block and the K tiles are used as loaded.

fn prepare_q_tile(li: u32, q0: u32) {
}

fn prepare_k_tile(li: u32, k0: u32, nk: u32) {
}
