//#include "attention_grad_common.wgsl"
// The dq of one query row, shared by attention_grad_q.wgsl and attention_window_grad_q.wgsl:
// dq_i = scale sum_j ds_ij k_j, ds_ij = P_ij (dp_ij - D_i), 0 at masked keys (FlashAttention-2
// backward, Dao 2023, untiled). Two passes over the row's keys: softmax_stats, then dq.

const WANT_D: bool = true;

// Writes dq of the query row at q_base (sequence b, kv head kh) over its keys [lo, hi), key j
// at k / v row kv_row0 + j.
fn query_row_grad(q_base: u32, b: u32, kh: u32, kv_row0: u32, lo: u32, hi: u32) {
    var qv: array<f32, HD>;
    var dov: array<f32, HD>;
    load_query_row(&qv, &dov, q_base);
    let st = softmax_stats(&qv, &dov, b, kh, kv_row0, lo, hi);
    let m = st.x;
    let inv_l = 1.0 / st.y;
    let dd = st.z * inv_l;
    var acc: array<f32, HD>;
    for (var j = lo; j < hi; j = j + 1u) {
        if (!kept(b, j)) {
            continue;
        }
        let kv_base = (kv_row0 + j) * p.nkv * HD + kh * HD;
        var s = 0.0;
        var dp = 0.0;
        for (var d = 0u; d < HD; d = d + 1u) {
            s = s + qv[d] * k[kv_base + d];
            dp = dp + dov[d] * v[kv_base + d];
        }
        let ds = exp(s * p.scale - m) * inv_l * (dp - dd);
        for (var d = 0u; d < HD; d = d + 1u) {
            acc[d] = acc[d] + ds * k[kv_base + d];
        }
    }
    for (var d = 0u; d < HD; d = d + 1u) {
        out[q_base + d] = acc[d] * p.scale;
    }
}
