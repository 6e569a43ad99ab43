// attention.wgsl and attention_lanes.wgsl hooks for CausalAttentionRoPE (ir/ops/attention.py): q
// and k are rotated as the RoPE op does (rope.wgsl; Su et al. 2021, eq. 15), pair t of a row by the angle
// pos * inv_freq[t]; pairs are (t, t + HD/2) for the 'half' layout and (2t, 2t + 1) for
// 'adjacent'. The Q block and each K tile are rotated once in workgroup memory, right
// after they are loaded, so neither rotated tensor is ever stored.
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

// Row j = i / (HD/2) of a tile whose row j is at position pos0 + j, the element indices of its
// pair i % (HD/2), and their cos/sin: rotation i of the tile.
struct RopeSlot {
    row: u32,
    at: vec2<u32>,
    cs: vec2<f32>,
}

fn rope_slot(i: u32, pos0: u32) -> RopeSlot {
    let j = i / (HD / 2u);
    let t = i % (HD / 2u);
    return RopeSlot(j, rope_pair(t), rope_cos_sin(pos0 + j, t));
}

fn rotate(x0: f32, x1: f32, cs: vec2<f32>) -> vec2<f32> {
    return vec2<f32>(x0 * cs.x - x1 * cs.y, x0 * cs.y + x1 * cs.x);
}

// Rotates the BQ rows of q_tile (row r at position q0 + r); every invocation calls it.
fn prepare_q_tile(li: u32, q0: u32) {
    for (var i = li; i < BQ * (HD / 2u); i = i + WG) {
        let r = rope_slot(i, q0);
        let y = rotate(q_tile[r.row][r.at.x / 4u][r.at.x % 4u], q_tile[r.row][r.at.y / 4u][r.at.y % 4u], r.cs);
        q_tile[r.row][r.at.x / 4u][r.at.x % 4u] = y.x;
        q_tile[r.row][r.at.y / 4u][r.at.y % 4u] = y.y;
    }
    workgroupBarrier();
}

// Rotates the nk key rows of k_tile (key k0 + j of the sequence in row j); every invocation
// calls it.
fn prepare_k_tile(li: u32, k0: u32, nk: u32) {
    for (var i = li; i < nk * (HD / 2u); i = i + WG) {
        let r = rope_slot(i, k0);
        let y = rotate(k_tile[r.row][r.at.x / 4u][r.at.x % 4u], k_tile[r.row][r.at.y / 4u][r.at.y % 4u], r.cs);
        k_tile[r.row][r.at.x / 4u][r.at.x % 4u] = y.x;
        k_tile[r.row][r.at.y / 4u][r.at.y % 4u] = y.y;
    }
    workgroupBarrier();
}
