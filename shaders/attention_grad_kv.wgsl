//#include "attention_grad_kv_common.wgsl"
//#include "attention_grad_params.wgsl"
// AttentionGradK and AttentionGradV (ir/ops/attention.py attention_grads): for key row j of kv
// head kh, dv_j = sum_h sum_i P_ij dO_i and dk_j = scale sum_h sum_i ds_ij q_i, the sums
// over the query heads h of kh's GQA group and over the query rows i (i >= j if causal),
// with P, D and ds as attention_grad_q.wgsl defines them (FlashAttention-2 backward, Dao
// 2023, without tiling). One invocation per (sequence, kv head, key row), 64 key rows per
// workgroup. P_ij needs the softmax statistics of query row i (max, 1 / sum and, for dk,
// D_i), which the IR does not keep from the forward pass: for each chunk of 64 query rows
// the workgroup recomputes them, one row per invocation, into workgroup memory, then each
// invocation adds the chunk's contributions to its key row. Knowingly slow: every block
// of 64 key rows recomputes the statistics of all the query rows it meets, so a head
// costs about ceil(seq / 64) * seq^2 * HD multiply-adds for them (half with causal; twice
// for dk), against seq^2 * HD for the forward; a forward that saved the logsumexp (as
// FlashAttention-2 does) would remove that factor.
// Template slots: HEAD_DIM; WANT_K (dk, else dv); CAUSAL; KEPT as in
// attention_grad_q.wgsl; KEY_END (seq, or qi + 1 for causal) bounds query row qi's keys.

const CAUSAL: bool = {{CAUSAL}};

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
    let live = kj < p.seq;  // no early return: the chunk loop has barriers
    let kv_base = (b * p.seq + min(kj, p.seq - 1u)) * p.nkv * HD + kh * HD;
    let key_kept = kept(b, min(kj, p.seq - 1u));
    var kv: array<f32, HD>;
    var vv: array<f32, HD>;
    var acc: array<f32, HD>;
    for (var d = 0u; d < HD; d = d + 1u) {
        kv[d] = k[kv_base + d];
        vv[d] = v[kv_base + d];
    }
    // With causal masking only query rows i >= j see key j: skip the chunks before the block.
    let i_start = select(0u, kb * 64u, CAUSAL);
    for (var hh = 0u; hh < p.group; hh = hh + 1u) {
        let h = kh * p.group + hh;
        for (var i0 = i_start; i0 < p.seq; i0 = i0 + 64u) {
            let qi = i0 + li;
            if (qi < p.seq) {
                let st = row_stats((b * p.seq + qi) * p.nh * HD + h * HD, b, kh, b * p.seq, 0u, {{KEY_END}});
                row_m[li] = st.x;
                row_il[li] = st.y;
                row_d[li] = st.z;
            }
            workgroupBarrier();
            if (live) {
                let end = min(64u, p.seq - i0);
                for (var ii = 0u; ii < end; ii = ii + 1u) {
                    let i = i0 + ii;
                    if (CAUSAL && i < kj) {
                        continue;
                    }
                    add_query_row(&acc, &kv, &vv, (b * p.seq + i) * p.nh * HD + h * HD, ii, key_kept);
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
