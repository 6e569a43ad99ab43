//#include "attention_grad_common.wgsl"
// Shared by attention_grad_kv.wgsl and attention_window_grad_kv.wgsl: the softmax statistics
// of a chunk of 64 query rows, kept in workgroup memory, and one query row's contribution to
// the gradient of a key row. Template slot: WANT_K (dk, else dv).

const WANT_K: bool = {{WANT_K}};
const WANT_D: bool = WANT_K;  // D enters dk only

var<workgroup> row_m: array<f32, 64>;   // max score of each query row of the chunk
var<workgroup> row_il: array<f32, 64>;  // 1 / sum exp(s - max)
var<workgroup> row_d: array<f32, 64>;   // D = sum_j P_j dp_j (dk only)

// Softmax statistics (max, 1 / sum, D) of the query row at q_base (sequence b, kv head kh)
// over its keys [lo, hi), key j at k / v row kv_row0 + j.
fn row_stats(q_base: u32, b: u32, kh: u32, kv_row0: u32, lo: u32, hi: u32) -> vec3<f32> {
    var qv: array<f32, HD>;
    var dov: array<f32, HD>;
    load_query_row(&qv, &dov, q_base);
    let st = softmax_stats(&qv, &dov, b, kh, kv_row0, lo, hi);
    return vec3<f32>(st.x, 1.0 / st.y, st.z / st.y);
}

// Adds to acc the term of the query row at q_base, row ii of the chunk, for the key row kv
// (value row vv; masked unless key_kept): P_ij dO_i for dv, ds_ij q_i for dk.
fn add_query_row(acc: ptr<function, array<f32, HD>>, kv: ptr<function, array<f32, HD>>,
                 vv: ptr<function, array<f32, HD>>, q_base: u32, ii: u32, key_kept: bool) {
    var s = 0.0;
    for (var d = 0u; d < HD; d = d + 1u) {
        s = s + q[q_base + d] * (*kv)[d];
    }
    s = select(MASK_SENTINEL, s * p.scale, key_kept);
    let pr = exp(s - row_m[ii]) * row_il[ii];
    if (WANT_K) {
        if (key_kept) {
            var dp = 0.0;
            for (var d = 0u; d < HD; d = d + 1u) {
                dp = dp + dout[q_base + d] * (*vv)[d];
            }
            let ds = pr * (dp - row_d[ii]);
            for (var d = 0u; d < HD; d = d + 1u) {
                (*acc)[d] = (*acc)[d] + ds * q[q_base + d];
            }
        }
    } else {
        for (var d = 0u; d < HD; d = d + 1u) {
            (*acc)[d] = (*acc)[d] + pr * dout[q_base + d];
        }
    }
}
