//#include "common.wgsl"
// Scaled dot-product attention with GQA for FullAttention and CausalAttention
// (Vaswani et al. 2017, eq. 1; ir.ops.attention_reference). Rows hold `batch` sequences
// of `seq` rows each; q and out are [rows, nh * HD], k and v [rows, nkv * HD]; query
// head h reads kv head h / group. One invocation per (sequence, head, query row), 64
// query rows of one head per workgroup; keys are streamed with an online softmax
// (Milakov & Gimelshein 2018), so no score matrix is stored.
// Template slots: HEAD_DIM; MASK_BINDING and MASK (key_mask [batch, seq], a
// masked score becomes MASK_SENTINEL, so a fully masked row averages all values, as in
// the reference); KEY_END (seq, or qi + 1 for causal: later keys get weight 0).

const HD: u32 = {{HEAD_DIM}}u;

struct Params {
    seq: u32,
    nh: u32,
    nkv: u32,
    group: u32,     // nh / nkv
    q_blocks: u32,  // ceil(seq / 64)
    total: u32,     // batch * nh * q_blocks workgroups
    scale: f32,     // 1 / sqrt(HD)
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
{{MASK_BINDING}}
@group(0) @binding({{OUT}}) var<storage, read_write> out: array<f32>;
@group(0) @binding({{UNIFORM}}) var<uniform> p: Params;

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
    let q_base = (b * p.seq + qi) * p.nh * HD + h * HD;
    var qv: array<f32, HD>;
    var acc: array<f32, HD>;
    for (var d = 0u; d < HD; d = d + 1u) {
        qv[d] = q[q_base + d];
    }
    var m = MAX_INIT;
    var l = 0.0;
    let kv_width = p.nkv * HD;
    for (var j = 0u; j < {{KEY_END}}; j = j + 1u) {
        let kv_base = (b * p.seq + j) * kv_width + kh * HD;
        var dot_qk = 0.0;
        for (var d = 0u; d < HD; d = d + 1u) {
            dot_qk = dot_qk + qv[d] * k[kv_base + d];
        }
        var s = dot_qk * p.scale;
{{MASK}}
        let m_new = max(m, s);
        let corr = exp(m - m_new);
        let w = exp(s - m_new);
        l = l * corr + w;
        for (var d = 0u; d < HD; d = d + 1u) {
            acc[d] = acc[d] * corr + w * v[kv_base + d];
        }
        m = m_new;
    }
    let inv = 1.0 / l;
    for (var d = 0u; d < HD; d = d + 1u) {
        out[q_base + d] = acc[d] * inv;
    }
}
