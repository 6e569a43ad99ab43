// attention_cached.wgsl's NEW_KEY hooks for CachedAttentionRoPEAppend of one new row (ir/ops/
// kv_cache.py): the query row's last key, at position pos, is the op's new row, read from its
// inputs k and v (at k_start / v_start) rather than from the caches. Its key and value rows
// are loaded beside q into workgroup memory, the key rotated in the step that rotates q
// (attention_cached_rope.wgsl's rope_slot; Su et al. 2021), and the key joins the chunk of
// keys it falls in like any other: scored there, weighted by that chunk's softmax, its V row
// added by the invocations of the first key subset. The workgroups of the first query head
// of each KV group write both rows into the caches at row pos, which no workgroup reads (the
// cache's keys are those before pos). A position at or past the cache's end has no new key:
// nothing is read or written there.

var<workgroup> k_row: array<vec4<f32>, HD4>;
var<workgroup> v_row: array<vec4<f32>, HD4>;

fn stage_new(li: u32, kv_col: u32) {
    if (li < HD4) {
        k_row[li] = k4(p.k_start + kv_col, li);
        v_row[li] = v4(p.v_start + kv_col, li);
    }
}

// After rotate_q's barrier, so k_row is loaded; the barrier before the keys' loop orders it.
fn rotate_new(li: u32) {
    if (li < HD / 2u) {
        let t = rope_slot(li, cache_pos[0]);
        let x0 = k_row[t.i0 / 4u][t.i0 % 4u];
        let x1 = k_row[t.i1 / 4u][t.i1 % 4u];
        k_row[t.i0 / 4u][t.i0 % 4u] = x0 * t.c - x1 * t.s;
        k_row[t.i1 / 4u][t.i1 % 4u] = x0 * t.s + x1 * t.c;
    }
}

fn new_score() -> f32 {
    var s = 0.0;
    for (var c = 0u; c < HD4; c = c + 1u) {
        s = s + dot(q_row[c], k_row[c]);
    }
    return s * p.scale;
}

// The new key's weight times its V row when the chunk from k0 holds it.
fn new_value(k0: u32, col: u32, key_end: u32) -> vec4<f32> {
    let pos = cache_pos[0];
    if (pos >= k0 && pos - k0 < WG && pos < key_end) {
        return weight[pos - k0] * v_row[col];
    }
    return vec4<f32>();
}

fn write_new(li: u32, h: u32, kv_col: u32, key_end: u32) {
    let pos = cache_pos[0];
    if (pos < key_end && h % p.group == 0u && li < HD4) {
        store_k_cache(pos * p.kv_stride + kv_col, li, k_row[li]);
        store_v_cache(pos * p.kv_stride + kv_col, li, v_row[li]);
    }
}
