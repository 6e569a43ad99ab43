// attention_cached.wgsl's rotate_q for CachedAttentionRoPE (ir/ops/kv_cache.py): the query row
// in q_row (workgroup memory) is rotated as RoPEDynamic does (rope_rotate.wgsl; Su et al.
// 2021, eq. 15), once per workgroup: invocation t < HD/2 rotates pair t by the angle
// position * inv_freq[t]. Pairs are (t, t + HD/2) for the 'half' layout and (2t, 2t + 1)
// for 'adjacent'; each invocation reads and writes its own pair only.

// Pair t of a row at `position`: its two elements and the cosine and sine of its angle.
struct RopeSlot {
    i0: u32,
    i1: u32,
    c: f32,
    s: f32,
}

fn rope_slot(t: u32, position: u32) -> RopeSlot {
    var i0 = t;
    var i1 = t + HD / 2u;
    if (p.adjacent == 1u) {
        i0 = 2u * t;
        i1 = i0 + 1u;
    }
    let ang = reduce_angle(f32(position) * p.inv_freq[t / 4u][t % 4u]);
    return RopeSlot(i0, i1, cos(ang), sin(ang));
}

fn rotate_q(li: u32, position: u32) {
    workgroupBarrier();  // q_row is loaded
    if (li < HD / 2u) {
        let r = rope_slot(li, position);
        let x0 = q_row[r.i0 / 4u][r.i0 % 4u];
        let x1 = q_row[r.i1 / 4u][r.i1 % 4u];
        q_row[r.i0 / 4u][r.i0 % 4u] = x0 * r.c - x1 * r.s;
        q_row[r.i1 / 4u][r.i1 % 4u] = x0 * r.s + x1 * r.c;
    }
}
