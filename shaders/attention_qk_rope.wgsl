// attention.wgsl hooks for CausalAttentionRoPE (ir.ops_fused): q and k are rotated as
// the RoPE op does (rope.wgsl; Su et al. 2021, eq. 15), pair t of a row by the angle
// pos * inv_freq[t]; pairs are (t, t + HD/2) for the 'half' layout and (2t, 2t + 1) for
// 'adjacent'. The query row is rotated once; each key row is rotated on the fly inside
// its score, so neither rotated tensor is ever stored.
// Positions: the op's position of row r is pos_offset + r mod seq, but a score depends
// only on the difference of the query's and the key's positions (Su et al. 2021:
// R(m)^T R(n) = R(n - m)), so the kernel uses pos = r mod seq: the same scores, without
// the f32 angle error that grows with pos_offset (outputs off by up to 0.3 at 10^6).

fn rope_pair(t: u32) -> vec2<u32> {
    if (p.adjacent == 1u) {
        return vec2<u32>(2u * t, 2u * t + 1u);
    }
    return vec2<u32>(t, t + HD / 2u);
}

fn rope_cos_sin(row: u32, t: u32) -> vec2<f32> {
    let ang = reduce_angle(f32(row) * p.inv_freq[t / 4u][t % 4u]);
    return vec2<f32>(cos(ang), sin(ang));
}

fn load_q(qv: ptr<function, array<f32, HD>>, q_base: u32, row: u32) {
    for (var t = 0u; t < HD / 2u; t = t + 1u) {
        let i = rope_pair(t);
        let cs = rope_cos_sin(row, t);
        let x0 = {{Q}}[q_base + i.x];
        let x1 = {{Q}}[q_base + i.y];
        (*qv)[i.x] = x0 * cs.x - x1 * cs.y;
        (*qv)[i.y] = x0 * cs.y + x1 * cs.x;
    }
}

fn qk_dot(qv: ptr<function, array<f32, HD>>, kv_base: u32, row: u32) -> f32 {
    var s = 0.0;
    for (var t = 0u; t < HD / 2u; t = t + 1u) {
        let i = rope_pair(t);
        let cs = rope_cos_sin(row, t);
        let k0 = {{K}}[kv_base + i.x];
        let k1 = {{K}}[kv_base + i.y];
        s = s + (*qv)[i.x] * (k0 * cs.x - k1 * cs.y) + (*qv)[i.y] * (k0 * cs.y + k1 * cs.x);
    }
    return s;
}
