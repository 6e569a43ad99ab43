//#include "attention_window_common.wgsl"
//#include "attention_grad_q_common.wgsl"
// SlidingWindowAttentionGradQ and CrossAttentionGradQ (ir/ops/attention.py windowed_attention):
// dq_i = scale sum_j ds_ij k_j over the key range of row i, with P = softmax(mask(scale q k^T))
// over that range recomputed max-subtracted as the forward does, dp_ij = dO_i . v_j,
// D_i = sum_j P_ij dp_ij and ds_ij = P_ij (dp_ij - D_i), 0 at masked keys (FlashAttention-2
// backward, Dao 2023, untiled; the IR keeps no logsumexp from the forward, so the first pass
// recomputes it). Layout as attention_window.wgsl. One invocation per (sequence, head, query
// row), 64 rows per workgroup; two passes over the row's keys.

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let wg = linear_workgroup(wid, nwg);
    if (wg >= p.total) {
        return;
    }
    let bh = wg / p.blocks;
    let h = bh % p.nh;
    let b = bh / p.nh;
    let qi = (wg % p.blocks) * 64u + li;
    if (qi >= p.q_seq) {
        return;
    }
    let r = key_range(qi);
    query_row_grad((b * p.q_seq + qi) * p.nh * HD + h * HD, b, h / p.group, b * p.kv_seq, r.x, r.y);
}
