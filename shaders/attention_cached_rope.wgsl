// attention_cached.wgsl's rotate_q for CachedAttentionRoPE (ir/ops/kv_cache.py): the query row
// in q_row (workgroup memory) is rotated as RoPEDynamic does (rope_rotate.wgsl; Su et al.
// 2021, eq. 15), once per workgroup: invocation t < HD/2 rotates pair t by the angle
// position * inv_freq[t]. Pairs are (t, t + HD/2) for the 'half' layout and (2t, 2t + 1)
// for 'adjacent'; each invocation reads and writes its own pair only.
fn rotate_q(li: u32, position: u32) {
    workgroupBarrier();  // q_row is loaded
    if (li < HD / 2u) {
        var i0 = li;
        var i1 = li + HD / 2u;
        if (p.adjacent == 1u) {
            i0 = 2u * li;
            i1 = i0 + 1u;
        }
        let ang = reduce_angle(f32(position) * p.inv_freq[li / 4u][li % 4u]);
        let c = cos(ang);
        let s = sin(ang);
        let x0 = q_row[i0 / 4u][i0 % 4u];
        let x1 = q_row[i1 / 4u][i1 % 4u];
        q_row[i0 / 4u][i0 % 4u] = x0 * c - x1 * s;
        q_row[i1 / 4u][i1 % 4u] = x0 * s + x1 * c;
    }
}
