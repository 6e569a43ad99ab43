//#include "attention_grad_q_common.wgsl"
//#include "attention_grad_params.wgsl"
// AttentionGradQ (ir/ops/attention.py attention_grads): dq_i = scale sum_j ds_ij k_j with
// P = softmax(mask(scale q k^T)) recomputed max-subtracted as the forward and the reference
// do, dp_ij = dO_i . v_j, D_i = sum_j P_ij dp_ij and ds_ij = P_ij (dp_ij - D_i), 0 at masked
// keys (FlashAttention-2 backward, Dao 2023, without tiling). Layout as attention.wgsl:
// `batch` sequences of `seq` rows, q/dO/dq [rows, nh * HD], k/v [rows, nkv * HD], query
// head h reads kv head h / group. One invocation per (sequence, head, query row), 64 query
// rows of one head per workgroup; two passes over the keys: the first carries the max,
// the sum and D online (Milakov & Gimelshein 2018), the second accumulates dq. Cost: about
// twice the forward kernel's, 4 * seq * HD multiply-adds per row (half that if causal).
// Template slots: HEAD_DIM; KEPT (key_mask [batch, seq] > 0 keeps key j
// of sequence b; a masked score is MASK_SENTINEL, so a fully masked row has uniform P and
// zero ds); KEY_END (seq, or qi + 1 for causal).

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
    if (qi >= p.seq) {
        return;
    }
    query_row_grad((b * p.seq + qi) * p.nh * HD + h * HD, b, h / p.group, b * p.seq, 0u, {{KEY_END}});
}
