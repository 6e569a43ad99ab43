//#include "common.wgsl"
// Shared by the attention gradient kernels (attention_grad_*.wgsl, attention_window_grad_*.wgsl):
// the key mask and the softmax statistics of one query row, computed online over its keys
// (Milakov & Gimelshein 2018) since the IR keeps no logsumexp from the forward. The kernels
// bind dout, q, k, v, (key_mask,) out; the including kernel defines HD and WANT_D (whether
// D, below, is needed); template slot KEPT (key_mask [batch, keys] > 0 keeps key j of
// sequence b, or `true`; a masked score is MASK_SENTINEL).

fn kept(b: u32, j: u32) -> bool {
    return {{KEPT}};
}

// The q and dO rows at q_base (one query row of one head) into qv and dov.
fn load_query_row(qv: ptr<function, array<f32, HD>>, dov: ptr<function, array<f32, HD>>, q_base: u32) {
    for (var d = 0u; d < HD; d = d + 1u) {
        (*qv)[d] = q[q_base + d];
        (*dov)[d] = dout[q_base + d];
    }
}

// (m, l, dsum) of the query row qv (dO row dov) of sequence b over keys [lo, hi) of kv head
// kh, key j at k / v row kv_row0 + j: m the max score, l = sum_j exp(s_j - m) and
// dsum = sum_j exp(s_j - m) dp_j with dp_j = dO . v_j (0 unless WANT_D), so P_j =
// exp(s_j - m) / l and D = sum_j P_j dp_j = dsum / l.
fn softmax_stats(qv: ptr<function, array<f32, HD>>, dov: ptr<function, array<f32, HD>>,
                 b: u32, kh: u32, kv_row0: u32, lo: u32, hi: u32) -> vec3<f32> {
    var m = MAX_INIT;
    var l = 0.0;
    var dsum = 0.0;  // rescaled with m as l is
    for (var j = lo; j < hi; j = j + 1u) {
        let kv_base = (kv_row0 + j) * p.nkv * HD + kh * HD;
        var s = 0.0;
        var dp = 0.0;
        for (var d = 0u; d < HD; d = d + 1u) {
            s = s + (*qv)[d] * k[kv_base + d];
            if (WANT_D) {
                dp = dp + (*dov)[d] * v[kv_base + d];
            }
        }
        s = select(MASK_SENTINEL, s * p.scale, kept(b, j));
        let m_new = max(m, s);
        let corr = exp(m - m_new);
        let w = exp(s - m_new);
        l = l * corr + w;
        dsum = dsum * corr + w * dp;
        m = m_new;
    }
    return vec3<f32>(m, l, dsum);
}
