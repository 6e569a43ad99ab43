//#include "attention_window_common.wgsl"
//#include "attention_grad_kv_common.wgsl"
// SlidingWindowAttentionGradK/V and CrossAttentionGradK/V (ir/ops/attention.py windowed_attention):
// for key row j of kv head kh, dv_j = sum_h sum_i P_ij dO_i and dk_j = scale sum_h sum_i ds_ij q_i,
// the sums over the query heads h of kh's GQA group and the query rows i that see j
// (query_range), P, D and ds as attention_window_grad_q.wgsl defines them. One invocation per
// (sequence, kv head, key row), 64 key rows per workgroup. P_ij needs the softmax statistics
// of query row i (max, 1 / sum and, for dk, D_i), which the IR does not keep from the
// forward: for each chunk of 64 query rows that see a key of the block, the workgroup
// recomputes them, one row per invocation, into workgroup memory, then each invocation adds
// the chunk's contributions to its key row. Knowingly slow for CrossAttention: every block
// of 64 key rows recomputes the statistics of all q_seq query rows, ceil(kv_seq / 64) *
// q_seq * kv_seq * HD multiply-adds per head (twice for dk) against q_seq * kv_seq * HD for
// the forward; a sliding window only meets the 63 + window rows after its block, each with
// at most `window` keys. Template slots: those of the included files.

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let wg = linear_workgroup(wid, nwg);
    if (wg >= p.total) {
        return;
    }
    let kb = wg % p.blocks;
    let bk = wg / p.blocks;
    let kh = bk % p.nkv;
    let b = bk / p.nkv;
    let kj = kb * 64u + li;
    let live = kj < p.kv_seq;  // no early return: the chunk loop has barriers
    let kc = min(kj, p.kv_seq - 1u);
    let kv_base = (b * p.kv_seq + kc) * p.nkv * HD + kh * HD;
    let key_kept = kept(b, kc);
    let mine = query_range(kc);
    var kv: array<f32, HD>;
    var vv: array<f32, HD>;
    var acc: array<f32, HD>;
    for (var d = 0u; d < HD; d = d + 1u) {
        kv[d] = k[kv_base + d];
        vv[d] = v[kv_base + d];
    }
    // Query rows that see some key of the block (the same for every invocation).
    let first = query_range(kb * 64u).x;
    let last = query_range(min(kb * 64u + 63u, p.kv_seq - 1u)).y;
    for (var hh = 0u; hh < p.group; hh = hh + 1u) {
        let h = kh * p.group + hh;
        for (var i0 = first; i0 < last; i0 = i0 + 64u) {
            let qi = i0 + li;
            if (qi < last) {
                let r = key_range(qi);
                let st = row_stats((b * p.q_seq + qi) * p.nh * HD + h * HD, b, kh, b * p.kv_seq, r.x, r.y);
                row_m[li] = st.x;
                row_il[li] = st.y;
                row_d[li] = st.z;
            }
            workgroupBarrier();
            if (live) {
                let lo = max(i0, mine.x);
                let hi = min(i0 + 64u, mine.y);
                for (var i = lo; i < hi; i = i + 1u) {
                    add_query_row(&acc, &kv, &vv, (b * p.q_seq + i) * p.nh * HD + h * HD, i - i0, key_kept);
                }
            }
            workgroupBarrier();
        }
    }
    if (live) {
        let scale = select(1.0, p.scale, WANT_K);
        for (var d = 0u; d < HD; d = d + 1u) {
            out[kv_base + d] = acc[d] * scale;
        }
    }
}
