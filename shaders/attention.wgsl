//#include "common.wgsl"
// Scaled dot-product attention with GQA for FullAttention, CausalAttention and
// CausalAttentionRoPE (Vaswani et al. 2017, eq. 1; ir/ops/attention.py attention_reference), tiled as
// FlashAttention (Dao et al. 2022, alg. 1) with online softmax (Milakov & Gimelshein
// 2018): a workgroup of WG invocations takes BQ query rows of one (sequence, head) and
// walks the keys in tiles of BK. Everything a row needs lives in workgroup memory, and
// each phase of a tile spreads its work over all invocations, so no invocation holds a
// row in registers:
// 1. the Q block (once) and each K and V tile are loaded cooperatively (coalesced, vec4
//    when HD % 4 == 0); the QK hooks may then rotate Q and K in place (RoPE);
// 2. the BQ x BK scores are computed, one or more per invocation, into s_tile;
// 3. invocation r < BQ updates row r's running max m and sum l, turns its scores into
//    weights exp(s - m) and records the factor corr = exp(m_old - m) for the accumulator;
// 4. invocation li = r * HD4 + c < BQ * HD4 owns vec4 c of row r's output: it rescales
//    its accumulator by corr and adds the tile's weights times V.
// Rows hold `batch` sequences of `seq` rows each; q and out are [rows, nh * HD], k and v
// [rows, nkv * HD]; query head h reads kv head h / group. Vectors are zero-padded to HD4
// vec4s, so any HD works; padding adds 0 to every dot product and is never written.
// Scores of keys a row may not see (past the causal diagonal or past the sequence) are
// MAX_INIT and their weights 0; a key masked by key_mask scores MASK_SENTINEL, so a fully
// masked row averages all values, as in the reference.
// Template slots: HEAD_DIM, BQ, BK, WG (ir/ops/attention.py attention_tiles: the tiles fit
// ATTENTION_TILE_BYTES of workgroup memory); MASK (key_mask [batch, seq], bound after v);
// KEY_END (keys row qi sees: p.seq, or qi + 1u for causal) and TILES_END (keys any row of
// the block sees: causal stops at the diagonal); QK defines prepare_q_tile and
// prepare_k_tile (attention_qk.wgsl: nothing; attention_qk_rope.wgsl: RoPE in workgroup
// memory, whose uniform fields come first in Params). IO defines the accessors of the q,
// k, v bindings, NAME4(row_base, c) (vec4 c of a row), and the output's store_out
// (ir/ops/attention.py attention_io); Q, K, V name
// the arrays read (one packed [rows, (nh + 2 nkv) * HD] projection, read through the
// strides and offsets).

const HD: u32 = {{HEAD_DIM}}u;
const HD4: u32 = (HD + 3u) / 4u;
const BQ: u32 = {{BQ}}u;
const BK: u32 = {{BK}}u;
const WG: u32 = {{WG}}u;

{{IO}}

var<workgroup> q_tile: array<vec4<f32>, BQ * HD4>;
var<workgroup> k_tile: array<vec4<f32>, BK * HD4>;
var<workgroup> v_tile: array<vec4<f32>, BK * HD4>;
var<workgroup> s_tile: array<f32, BQ * BK>;  // scores, then weights, of the tile
var<workgroup> row_m: array<f32, BQ>;
var<workgroup> row_l: array<f32, BQ>;
var<workgroup> row_corr: array<f32, BQ>;

{{QK}}

fn key_end_of(qi: u32) -> u32 {
    return {{KEY_END}};
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
    let row0 = b * p.seq;
    let q0 = qb * BQ;
    for (var i = li; i < BQ * HD4; i = i + WG) {
        let qi = q0 + i / HD4;
        var v = vec4<f32>();
        if (qi < p.seq) {
            v = {{Q}}4((row0 + qi) * p.q_stride + h * HD, i % HD4);
        }
        q_tile[i] = v;
    }
    if (li < BQ) {
        row_m[li] = MAX_INIT;
        row_l[li] = 0.0;
    }
    workgroupBarrier();
    prepare_q_tile(li, q0);
    // phase 4's invocation: vec4 `col` of row `orow` (none when li >= BQ * HD4)
    let orow = li / HD4;
    let col = li % HD4;
    var acc = vec4<f32>();
    let tiles_end = {{TILES_END}};
    for (var k0 = 0u; k0 < tiles_end; k0 = k0 + BK) {
        let nk = min(BK, tiles_end - k0);
        workgroupBarrier();  // every invocation is done with the previous tile
        for (var i = li; i < BK * HD4; i = i + WG) {
            var kv = vec4<f32>();
            var vv = vec4<f32>();
            if (i / HD4 < nk) {
                let base = (row0 + k0 + i / HD4) * p.kv_stride + kh * HD;
                kv = {{K}}4(base + p.k_off, i % HD4);
                vv = {{V}}4(base + p.v_off, i % HD4);
            }
            k_tile[i] = kv;
            v_tile[i] = vv;
        }
        workgroupBarrier();
        prepare_k_tile(li, k0, nk);
        for (var e = li; e < BQ * BK; e = e + WG) {
            let r = e / BK;
            let j = e % BK;
            let key_end = key_end_of(q0 + r);
            var s = MAX_INIT;
            if (k0 + j < key_end && j < nk) {
                s = 0.0;
                for (var c = 0u; c < HD4; c = c + 1u) {
                    s = s + dot(q_tile[r * HD4 + c], k_tile[j * HD4 + c]);
                }
                s = s * p.scale;
{{MASK}}
            }
            s_tile[e] = s;
        }
        workgroupBarrier();
        if (li < BQ) {
            let m = row_m[li];
            var mt = m;
            for (var j = 0u; j < BK; j = j + 1u) {
                mt = max(mt, s_tile[li * BK + j]);
            }
            var lt = 0.0;
            for (var j = 0u; j < BK; j = j + 1u) {
                let s = s_tile[li * BK + j];
                let w = select(0.0, exp(s - mt), s != MAX_INIT);  // a NaN score stays NaN
                s_tile[li * BK + j] = w;
                lt = lt + w;
            }
            let corr = exp(m - mt);
            row_corr[li] = corr;
            row_l[li] = row_l[li] * corr + lt;
            row_m[li] = mt;
        }
        workgroupBarrier();
        if (orow < BQ) {
            acc = acc * row_corr[orow];
            for (var j = 0u; j < nk; j = j + 1u) {
                acc = acc + s_tile[orow * BK + j] * v_tile[j * HD4 + col];
            }
        }
    }
    workgroupBarrier();
    let qi = q0 + orow;
    if (orow < BQ && qi < p.seq) {
        store_out((row0 + qi) * p.nh * HD + h * HD, col, acc / row_l[orow]);
    }
}
