//#include "common.wgsl"
//#include "reduce.wgsl"
// AttentionScores (ir/ops/attention_general.py): ONNX Attention's qk_matmul_output
// [B, H, Sq, Skv] (https://onnx.ai/onnx/operators/onnx__Attention.html), one workgroup per
// query row, its invocations striding over the keys. MODE 0: scale q.k; 1: after the
// softcap; 2: plus the attention bias (-inf at disallowed keys: see attention_general.wgsl);
// 3: the softmax over the allowed keys (0 elsewhere, a row of EMPTY_ROW when none is allowed), the
// row's max and sum reduced in workgroup memory (reduce.wgsl) with the scores kept in out.
// Template slots: HEAD_DIM, MODE, KV_LEN and OFFSET, MASK, EMPTY_ROW (as attention_general.wgsl).

const HD: u32 = {{HEAD_DIM}}u;
const MODE: u32 = {{MODE}}u;
const LOWEST: f32 = -3.4028234663852886e38;

fn is_neg_inf(x: f32) -> bool {
    return bitcast<u32>(x) == 0xff800000u;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = linear_workgroup(wid, nwg);
    if (row >= p.rows) {
        return;
    }
    let qi = row % p.q_seq;
    let bh = row / p.q_seq;
    let h = bh % p.nh;
    let b = bh / p.nh;
    let kh = h / p.group;
    let kv_len = {{KV_LEN}};
    let off = {{OFFSET}};
    let q_base = b * p.q_sb + h * p.q_sh + qi * p.q_ss;
    let base = row * p.kv_seq;
    let neg_inf = bitcast<f32>(0xff800000u);
    var m = LOWEST;
    for (var j = li; j < p.kv_seq; j = j + 256u) {
        let k_base = b * p.k_sb + kh * p.k_sh + j * p.k_ss;
        var s = 0.0;
        for (var c = 0u; c < HD; c = c + 1u) {
            s = s + q[q_base + c] * k[k_base + c];
        }
        s = s * p.scale;
        if (MODE >= 1u && p.softcap > 0.0) {
            s = p.softcap * tanh_clamped(s / p.softcap);
        }
        if (MODE >= 2u) {
            let pos = i32(qi) + off;
            let jj = i32(j);
            var ok = j < kv_len;
            if (p.causal != 0u && jj > pos) {
                ok = false;
            }
            if (p.left >= 0 && pos - jj > p.left) {
                ok = false;
            }
            if (p.right >= 0 && jj - pos > p.right) {
                ok = false;
            }
            if (ok) {
{{MASK}}
            }
            s = select(neg_inf, s, ok);
            if (ok) {
                m = max(m, s);
            }
        }
        out[base + j] = s;
    }
    if (MODE == 3u) {
        m = workgroup_max(li, m);
        var total = 0.0;
        for (var j = li; j < p.kv_seq; j = j + 256u) {
            let s = out[base + j];
            let w = select(exp(s - m), 0.0, is_neg_inf(s));
            out[base + j] = w;
            total = total + w;
        }
        total = workgroup_sum(li, total);
        // a row of no allowed key (total 0), or one that made NaN (a NaN or +inf score): EMPTY_ROW everywhere
        let ok = total > 0.0;
        let inv = 1.0 / select(1.0, total, ok);
        for (var j = li; j < p.kv_seq; j = j + 256u) {
            out[base + j] = select({{EMPTY_ROW}}, out[base + j] * inv, ok);
        }
    }
}
