//#include "attention_window_common.wgsl"
// SlidingWindowAttentionGradQ and CrossAttentionGradQ (ir.ops_extra windowed_attention):
// dq_i = scale sum_j ds_ij k_j over the key range of row i, with P = softmax(mask(scale q k^T))
// over that range recomputed max-subtracted as the forward does, dp_ij = dO_i . v_j,
// D_i = sum_j P_ij dp_ij and ds_ij = P_ij (dp_ij - D_i), 0 at masked keys (FlashAttention-2
// backward, Dao 2023, untiled; the IR keeps no logsumexp from the forward, so the first pass
// recomputes it). Layout as attention_window.wgsl. One invocation per (sequence, head, query
// row), 64 rows per workgroup; two passes over the row's keys.

@group(0) @binding(0) var<storage, read> dout: array<f32>;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
{{MASK_BINDING}}
@group(0) @binding({{OUT}}) var<storage, read_write> out: array<f32>;
@group(0) @binding({{UNIFORM}}) var<uniform> p: Params;

fn kept(b: u32, j: u32) -> bool {
    return {{KEPT}};
}

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
    let kh = h / p.group;
    let q_base = (b * p.q_seq + qi) * p.nh * HD + h * HD;
    var qv: array<f32, HD>;
    var dov: array<f32, HD>;
    for (var d = 0u; d < HD; d = d + 1u) {
        qv[d] = q[q_base + d];
        dov[d] = dout[q_base + d];
    }
    let r = key_range(qi);
    var m = MAX_INIT;
    var l = 0.0;
    var dsum = 0.0;  // sum_j exp(s_j - m) dp_j, rescaled with m
    for (var j = r.x; j < r.y; j = j + 1u) {
        let kv_base = (b * p.kv_seq + j) * p.nkv * HD + kh * HD;
        var s = 0.0;
        var dp = 0.0;
        for (var d = 0u; d < HD; d = d + 1u) {
            s = s + qv[d] * k[kv_base + d];
            dp = dp + dov[d] * v[kv_base + d];
        }
        s = select(MASK_SENTINEL, s * p.scale, kept(b, j));
        let m_new = max(m, s);
        let corr = exp(m - m_new);
        let w = exp(s - m_new);
        l = l * corr + w;
        dsum = dsum * corr + w * dp;
        m = m_new;
    }
    let inv_l = 1.0 / l;
    let dd = dsum * inv_l;
    var acc: array<f32, HD>;
    for (var j = r.x; j < r.y; j = j + 1u) {
        if (!kept(b, j)) {
            continue;
        }
        let kv_base = (b * p.kv_seq + j) * p.nkv * HD + kh * HD;
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
