//#include "common.wgsl"
// AttentionGradK and AttentionGradV (ir.ops_backward attention_grads): for key row j of kv
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
// Template slots: HEAD_DIM; WANT_K (dk, else dv); CAUSAL; MASK_BINDING and KEPT as in
// attention_grad_q.wgsl; KEY_END (seq, or qi + 1 for causal) bounds a query row's keys.

const HD: u32 = {{HEAD_DIM}}u;
const WANT_K: bool = {{WANT_K}};
const CAUSAL: bool = {{CAUSAL}};

struct Params {
    seq: u32,
    nh: u32,
    nkv: u32,
    group: u32,   // nh / nkv
    blocks: u32,  // ceil(seq / 64)
    total: u32,   // batch * nkv * blocks workgroups
    scale: f32,   // 1 / sqrt(HD)
}

@group(0) @binding(0) var<storage, read> dout: array<f32>;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
{{MASK_BINDING}}
@group(0) @binding({{OUT}}) var<storage, read_write> out: array<f32>;
@group(0) @binding({{UNIFORM}}) var<uniform> p: Params;

var<workgroup> row_m: array<f32, 64>;   // max score of each query row of the chunk
var<workgroup> row_il: array<f32, 64>;  // 1 / sum exp(s - max)
var<workgroup> row_d: array<f32, 64>;   // D = sum_j P_j dp_j (dk only)

fn kept(b: u32, j: u32) -> bool {
    return {{KEPT}};
}

// Softmax statistics (max, 1 / sum, D) of query row qi of head h in sequence b, computed
// online over its keys as attention_grad_q.wgsl's first pass.
fn row_stats(b: u32, h: u32, kh: u32, qi: u32) -> vec3<f32> {
    let q_base = (b * p.seq + qi) * p.nh * HD + h * HD;
    var qv: array<f32, HD>;
    var dov: array<f32, HD>;
    for (var d = 0u; d < HD; d = d + 1u) {
        qv[d] = q[q_base + d];
        dov[d] = dout[q_base + d];
    }
    var m = MAX_INIT;
    var l = 0.0;
    var dsum = 0.0;
    for (var j = 0u; j < {{KEY_END}}; j = j + 1u) {
        let kv_base = (b * p.seq + j) * p.nkv * HD + kh * HD;
        var s = 0.0;
        var dp = 0.0;
        for (var d = 0u; d < HD; d = d + 1u) {
            s = s + qv[d] * k[kv_base + d];
            if (WANT_K) {
                dp = dp + dov[d] * v[kv_base + d];
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
    return vec3<f32>(m, 1.0 / l, dsum / l);
}

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
            if (i0 + li < p.seq) {
                let st = row_stats(b, h, kh, i0 + li);
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
                    let q_base = (b * p.seq + i) * p.nh * HD + h * HD;
                    var s = 0.0;
                    for (var d = 0u; d < HD; d = d + 1u) {
                        s = s + q[q_base + d] * kv[d];
                    }
                    s = select(MASK_SENTINEL, s * p.scale, key_kept);
                    let pr = exp(s - row_m[ii]) * row_il[ii];
                    if (WANT_K) {
                        if (key_kept) {
                            var dp = 0.0;
                            for (var d = 0u; d < HD; d = d + 1u) {
                                dp = dp + dout[q_base + d] * vv[d];
                            }
                            let ds = pr * (dp - row_d[ii]);
                            for (var d = 0u; d < HD; d = d + 1u) {
                                acc[d] = acc[d] + ds * q[q_base + d];
                            }
                        }
                    } else {
                        for (var d = 0u; d < HD; d = d + 1u) {
                            acc[d] = acc[d] + pr * dout[q_base + d];
                        }
                    }
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
