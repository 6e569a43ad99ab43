//#include "common.wgsl"
// GeneralAttention (ir/ops/attention_general.py general_attention_ref): scaled dot-product
// attention as ONNX Attention defines it (https://onnx.ai/onnx/operators/onnx__Attention.html),
// tiled as attention.wgsl is (FlashAttention, Dao et al. 2022, alg. 1, with the online softmax
// of Milakov & Gimelshein 2018): a workgroup of WG invocations takes BQ query rows of one
// (batch, head) and walks the keys of the block's range [lo, hi) in tiles of BK.
// 1. the Q block (once) and each K and V tile are loaded cooperatively (vec4 where the head
//    size is a multiple of 4);
// 2. the BQ x BK scores: s = softcap(scale q.k) + mask, and whether the key is allowed
//    (inside the kv length, the causal frontier j <= i + offset, the window
//    i + offset - left <= j <= i + offset + right, the boolean mask, a float mask not -inf);
// 3. invocation r < BQ updates row r's running max and sum over its allowed keys only;
// 4. each invocation rescales and accumulates the output vec4s it owns (NACC of them).
// A row without any allowed key gets EMPTY_ROW: 0 (the ONNX fully-masked-row rule) or NaN (masked_rows nan).
// Tensors are addressed through (batch, head, row) element strides from a first element (q_off, k_off,
// v_off: their columns in one packed [B, S, (H + 2 KV) D] tensor, else 0), so the [B, S, H*D]
// (ONNX 3-D) and [B, H, S, D] (4-D) layouts take the same code; query head h reads kv head
// h / group (GQA).
// Template slots: HEAD_DIM (q, k), V_DIM (v, out), BQ, BK, WG, NACC (ir/ops/attention_general.py
// general_tiles: the tiles fit 16 KiB of workgroup memory); IO, the accessors q4, k4, v4 and
// store_out; KV_LEN and OFFSET, this batch's key count and causal offset (the uniforms, or
// from kv_lens [B]); MASK, the mask's test of key j of row qi (none, a bool mask or an
// additive float mask [.., mask_len], strides in Params); EMPTY_ROW, a row's value without an allowed key.

const HD: u32 = {{HEAD_DIM}}u;
const DV: u32 = {{V_DIM}}u;
const HD4: u32 = (HD + 3u) / 4u;
const DV4: u32 = (DV + 3u) / 4u;
const BQ: u32 = {{BQ}}u;
const BK: u32 = {{BK}}u;
const WG: u32 = {{WG}}u;
const NACC: u32 = {{NACC}}u;
// The lowest finite f32: the running max starts here, below every finite score.
const LOWEST: f32 = -3.4028234663852886e38;

{{IO}}

var<workgroup> q_tile: array<vec4<f32>, BQ * HD4>;
var<workgroup> k_tile: array<vec4<f32>, BK * HD4>;
var<workgroup> v_tile: array<vec4<f32>, BK * DV4>;
var<workgroup> s_tile: array<f32, BQ * BK>;  // scores, then weights
var<workgroup> ok_tile: array<u32, BQ * BK>;  // 1 where the key is allowed
var<workgroup> row_m: array<f32, BQ>;
var<workgroup> row_l: array<f32, BQ>;
var<workgroup> row_corr: array<f32, BQ>;

fn is_neg_inf(x: f32) -> bool {
    return bitcast<u32>(x) == 0xff800000u;
}

@compute @workgroup_size(WG)
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
    let kh = h / p.group;
    let q0 = qb * BQ;
    let kv_len = {{KV_LEN}};
    let off = {{OFFSET}};
    // the keys any row of the block may see
    let first = i32(q0) + off;
    let last = i32(min(q0 + BQ, p.q_seq)) - 1 + off;
    var lo = 0;
    var hi = i32(kv_len);
    if (p.causal != 0u) {
        hi = min(hi, last + 1);
    }
    if (p.right >= 0) {
        hi = min(hi, last + p.right + 1);
    }
    if (p.left >= 0) {
        lo = max(lo, first - p.left);
    }
    hi = max(hi, lo);
    for (var i = li; i < BQ * HD4; i = i + WG) {
        let qi = q0 + i / HD4;
        var v = vec4<f32>();
        if (qi < p.q_seq) {
            v = q4(p.q_off + b * p.q_sb + h * p.q_sh + qi * p.q_ss, i % HD4);
        }
        q_tile[i] = v;
    }
    if (li < BQ) {
        row_m[li] = LOWEST;
        row_l[li] = 0.0;
    }
    var acc: array<vec4<f32>, NACC>;
    for (var k0 = u32(lo); k0 < u32(hi); k0 = k0 + BK) {
        let nk = min(BK, u32(hi) - k0);
        workgroupBarrier();  // every invocation is done with the previous tile
        for (var i = li; i < BK * HD4; i = i + WG) {
            var kv = vec4<f32>();
            if (i / HD4 < nk) {
                kv = k4(p.k_off + b * p.k_sb + kh * p.k_sh + (k0 + i / HD4) * p.k_ss, i % HD4);
            }
            k_tile[i] = kv;
        }
        for (var i = li; i < BK * DV4; i = i + WG) {
            var vv = vec4<f32>();
            if (i / DV4 < nk) {
                vv = v4(p.v_off + b * p.v_sb + kh * p.v_sh + (k0 + i / DV4) * p.v_ss, i % DV4);
            }
            v_tile[i] = vv;
        }
        workgroupBarrier();
        for (var e = li; e < BQ * BK; e = e + WG) {
            let r = e / BK;
            let jt = e % BK;
            let qi = q0 + r;
            let j = k0 + jt;
            var s = 0.0;
            var ok = jt < nk && qi < p.q_seq;
            if (ok) {
                for (var c = 0u; c < HD4; c = c + 1u) {
                    s = s + dot(q_tile[r * HD4 + c], k_tile[jt * HD4 + c]);
                }
                s = s * p.scale;
                if (p.softcap > 0.0) {
                    s = p.softcap * tanh_clamped(s / p.softcap);
                }
                let pos = i32(qi) + off;
                let jj = i32(j);
                if (p.causal != 0u && jj > pos) {
                    ok = false;
                }
                if (p.left >= 0 && pos - jj > p.left) {
                    ok = false;
                }
                if (p.right >= 0 && jj - pos > p.right) {
                    ok = false;
                }
{{MASK}}
            }
            s_tile[e] = s;
            ok_tile[e] = select(0u, 1u, ok);
        }
        workgroupBarrier();
        if (li < BQ) {
            let m = row_m[li];
            var mt = m;
            for (var j = 0u; j < BK; j = j + 1u) {
                if (ok_tile[li * BK + j] != 0u) {
                    mt = max(mt, s_tile[li * BK + j]);
                }
            }
            var lt = 0.0;
            for (var j = 0u; j < BK; j = j + 1u) {
                let w = select(0.0, exp(s_tile[li * BK + j] - mt), ok_tile[li * BK + j] != 0u);
                s_tile[li * BK + j] = w;
                lt = lt + w;
            }
            let corr = exp(m - mt);
            row_corr[li] = corr;
            row_l[li] = row_l[li] * corr + lt;
            row_m[li] = mt;
        }
        workgroupBarrier();
        for (var n = 0u; n < NACC; n = n + 1u) {
            let o = li + n * WG;
            if (o < BQ * DV4) {
                let r = o / DV4;
                let c = o % DV4;
                var a = acc[n] * row_corr[r];
                for (var j = 0u; j < nk; j = j + 1u) {
                    a = a + s_tile[r * BK + j] * v_tile[j * DV4 + c];
                }
                acc[n] = a;
            }
        }
    }
    workgroupBarrier();
    for (var n = 0u; n < NACC; n = n + 1u) {
        let o = li + n * WG;
        let r = o / DV4;
        let qi = q0 + r;
        if (o < BQ * DV4 && qi < p.q_seq) {
            let l = row_l[r];
            let y = select(vec4<f32>({{EMPTY_ROW}}), acc[n] / l, l > 0.0);
            store_out(b * p.o_sb + h * p.o_sh + qi * p.o_ss, o % DV4, y);
        }
    }
}
