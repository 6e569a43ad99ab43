//#include "attention_window_common.wgsl"
// SlidingWindowAttention and CrossAttention (ir/ops/attention.py windowed_attention): scaled
// dot-product attention with GQA of each query row over its key range [lo, hi) (see
// key_range), a masked key's score being MASK_SENTINEL, so a row whose keys are all masked
// averages the values of its range, as the reference does. Layout: `batch` sequences, q and
// out [batch * q_seq, nh * HD], k and v [batch * kv_seq, nkv * HD]; query head h reads kv
// head h / group. One invocation per (sequence, head, query row), 64 query rows of one head
// per workgroup; the keys of the range are streamed with an online softmax (Milakov &
// Gimelshein 2018), so a sliding window costs window * HD multiply-adds per row, not seq * HD.

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
    var acc: array<f32, HD>;
    for (var d = 0u; d < HD; d = d + 1u) {
        qv[d] = q[q_base + d];
    }
    let r = key_range(qi);
    var m = MAX_INIT;
    var l = 0.0;
    for (var j = r.x; j < r.y; j = j + 1u) {
        let kv_base = (b * p.kv_seq + j) * p.nkv * HD + kh * HD;
        var s = 0.0;
        for (var d = 0u; d < HD; d = d + 1u) {
            s = s + qv[d] * k[kv_base + d];
        }
        s = select(MASK_SENTINEL, s * p.scale, kept(b, j));
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
