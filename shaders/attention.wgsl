//#include "common.wgsl"
// Scaled dot-product attention with GQA for FullAttention and CausalAttention
// (Vaswani et al. 2017, eq. 1; ir.ops.attention_reference). Rows hold `batch` sequences
// of `seq` rows each; q and out are [rows, nh * HD], k and v [rows, nkv * HD]; query
// head h reads kv head h / group. One invocation per (sequence, head, query row), 64
// query rows of one head per workgroup; keys are streamed with an online softmax
// (Milakov & Gimelshein 2018), so no score matrix is stored.
// Template slots: HEAD_DIM; MASK_BINDING and MASK (key_mask [batch, seq], a
// masked score becomes MASK_SENTINEL, so a fully masked row averages all values, as in
// the reference); KEY_END (seq, or qi + 1 for causal: later keys get weight 0); QK
// defines the hooks load_q (a query row into registers) and qk_dot (its dot product with
// a key row), attention_qk.wgsl or, for CausalAttentionRoPE, attention_qk_rope.wgsl,
// whose uniform fields ROPE_PARAMS adds. INPUTS declares the q, k, v storage bindings:
// three arrays, or one packed [rows, (nh + 2 nkv) * HD] projection read through the row
// strides and the k / v column offsets in Params; Q, K, V name the arrays read.

const HD: u32 = {{HEAD_DIM}}u;

struct Params {
{{ROPE_PARAMS}}
    seq: u32,
    nh: u32,
    nkv: u32,
    group: u32,     // nh / nkv
    q_blocks: u32,  // ceil(seq / 64)
    total: u32,     // batch * nh * q_blocks workgroups
    scale: f32,     // 1 / sqrt(HD)
    q_stride: u32,  // elements per row of q (nh * HD, or the packed width)
    kv_stride: u32, // elements per row of k and v (nkv * HD, or the packed width)
    k_off: u32,     // column of k's first element in its row (0, or nh * HD when packed)
    v_off: u32,     // column of v's first element (0, or (nh + nkv) * HD when packed)
}

{{INPUTS}}
{{MASK_BINDING}}
@group(0) @binding({{OUT}}) var<storage, read_write> out: array<f32>;
@group(0) @binding({{UNIFORM}}) var<uniform> p: Params;

{{QK}}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let wg = linear_workgroup(wid, nwg);
    if (wg >= p.total) {
        return;
    }
    let qb = wg % p.q_blocks;
    let bh = wg / p.q_blocks;
    let h = bh % p.nh;
    let b = bh / p.nh;
    let qi = qb * 64u + li;
    if (qi >= p.seq) {
        return;
    }
    let kh = h / p.group;
    let q_base = (b * p.seq + qi) * p.q_stride + h * HD;
    let o_base = (b * p.seq + qi) * p.nh * HD + h * HD;
    var qv: array<f32, HD>;
    var acc: array<f32, HD>;
    load_q(&qv, q_base, qi);
    var m = MAX_INIT;
    var l = 0.0;
    for (var j = 0u; j < {{KEY_END}}; j = j + 1u) {
        let kv_base = (b * p.seq + j) * p.kv_stride + kh * HD;
        var s = qk_dot(&qv, kv_base + p.k_off, j) * p.scale;
{{MASK}}
        let m_new = max(m, s);
        let corr = exp(m - m_new);
        let w = exp(s - m_new);
        l = l * corr + w;
        for (var d = 0u; d < HD; d = d + 1u) {
            acc[d] = acc[d] * corr + w * {{V}}[kv_base + p.v_off + d];
        }
        m = m_new;
    }
    let inv = 1.0 / l;
    for (var d = 0u; d < HD; d = d + 1u) {
        out[o_base + d] = acc[d] * inv;
    }
}
