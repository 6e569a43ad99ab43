//#include "common.wgsl"
// Scaled dot-product attention with GQA for FullAttention, FullAttentionPacked, CausalAttention and
// CausalAttentionRoPE where the lowering does not take attention_lanes.wgsl (ir/ops/attention.py
// lane_tiles: head_dim above LANES_MAX_HEAD_DIM, an op not in LANES_OPS, or no lane split that fits)
// (Vaswani et al. 2017, eq. 1; ir/ops/attention.py attention_reference), tiled as
// FlashAttention (Dao et al. 2022, alg. 1) with online softmax (Milakov & Gimelshein
// 2018): a workgroup of WG invocations takes BQ query rows of one (sequence, head) and
// walks the keys in tiles of BK. Everything a row needs lives in workgroup memory (but for
// the few scores each lane of phase 2 keeps in registers), and each phase of a tile spreads
// its work over all invocations:
// 1. the Q block (once) and each K and V tile are loaded cooperatively (coalesced, vec4
//    when HD % 4 == 0); the QK hooks may then rotate Q and K in place (RoPE);
// 2. TPR = WG / BQ invocations share each query row: lane t of row r scores keys t, t + TPR,
//    ... of the tile (kept in registers) and the row's new running max comes from their
//    partial maxima; each turns its scores into weights exp(s - m) in s_tile, and lane 0 adds
//    the partial sums into the row's sum l and records corr = exp(m_old - m) for the
//    accumulator (K rows lie KS = HD4 + 1 vec4s apart, so lanes reading consecutive keys do
//    not meet in one memory bank);
// 3. invocation li = r * HD4 + c < BQ * HD4 owns vec4 c of row r's output: it rescales
//    its accumulator by corr and adds the tile's weights times V (four keys at a time, into
//    four sums: on the H200 these two changes took SmolLM2's prefill attention from 27.2 to
//    20.9 us and MiniLM's from 44.3 to 38.5).
// Rows hold `batch` sequences of `seq` rows each; q and out are [rows, nh * HD], k and v
// [rows, nkv * HD]; query head h reads kv head h / group. Vectors are zero-padded to HD4
// vec4s, so any HD works; padding adds 0 to every dot product and is never written.
// Scores of keys a row may not see (past the causal diagonal or past the sequence) are
// MAX_INIT and their weights 0; a key masked by key_mask scores MASK_SENTINEL, so a fully
// masked row averages all values, as in the reference, unless MASKED_ROWS stores it as zeros
// (masked_rows "zero": the row's maximum is then MASK_SENTINEL) or, for a causal row, as MEAN_V's
// mean_v: the mean of v over all the sequence's keys, not only the keys up to the row's own.
// Template slots: HEAD_DIM, BQ, BK, WG (ir/ops/attention.py attention_tiles: the tiles fit the
// workgroup memory it allows, attention_tile_bytes; BK a power of two from 4 to 64); SCORE_DOTS
// (phase 2's dot products, unrolled: ir/ops/attention.py _score_dots); MASK (key_mask [batch,
// seq], f32, i32 or a bool's u32, bound after v, or after qkv when packed; which values drop a key:
// ir/ops/attention.py key_dropped_wgsl);
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
const TPR: u32 = WG / BQ;  // invocations per query row in the score phase
const KPT: u32 = (BK + TPR - 1u) / TPR;  // keys each of them scores per tile
const KS: u32 = HD4 + 1u;  // vec4s from one K row of k_tile to the next (padded)

{{IO}}

// Tiles indexed [row][vec4 or key]: WGSL with runtime checks clamps every index into a workgroup
// array that is not a constant, and this way the loops' indices are a row fixed for the loop and its counter, whose
// clamps the driver's compiler shares among the accesses of an iteration.
var<workgroup> q_tile: array<array<vec4<f32>, HD4>, BQ>;
var<workgroup> k_tile: array<array<vec4<f32>, KS>, BK>;
var<workgroup> v_tile: array<array<vec4<f32>, HD4>, BK>;
var<workgroup> s_tile: array<array<f32, BK>, BQ>;  // weights of the tile
var<workgroup> part: array<f32, BQ * TPR>;  // the lanes' partial maxima, then partial sums
var<workgroup> row_m: array<f32, BQ>;
var<workgroup> row_l: array<f32, BQ>;
var<workgroup> row_corr: array<f32, BQ>;

{{QK}}

fn key_end_of(qi: u32) -> u32 {
    return {{KEY_END}};
}
{{MEAN_V}}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let wg = linear_workgroup(wid, nwg);
    if (wg >= p.total) {
        // PREFETCH_HOOK (lowering/prefetch.py)
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
        q_tile[i / HD4][i % HD4] = v;
    }
    if (li < BQ) {
        row_m[li] = MAX_INIT;
        row_l[li] = 0.0;
    }
    workgroupBarrier();
    prepare_q_tile(li, q0);
    // phase 2's invocation: lane `st` of query row `sr` (none when li >= BQ * TPR)
    let sr = li / TPR;
    let st = li % TPR;
    // phase 3's invocation: vec4 `col` of row `orow` (none when li >= BQ * HD4)
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
            k_tile[i / HD4][i % HD4] = kv;
            v_tile[i / HD4][i % HD4] = vv;
        }
        workgroupBarrier();
        prepare_k_tile(li, k0, nk);
        var scores: array<f32, KPT>;
        var mt = MAX_INIT;  // this lane's maximum, then the row's new running maximum
        if (sr < BQ) {
            // the lane's KPT dot products side by side, each quad of the row's q read once for
            // all of them (unrolled in ir/ops/attention.py: named accumulators; a key past the
            // tile reads a clamped row of k_tile, its score dropped below)
{{SCORE_DOTS}}
            let key_end = key_end_of(q0 + sr);
            for (var i = 0u; i < KPT; i = i + 1u) {
                let j = st + i * TPR;
                var s = MAX_INIT;
                if (j < nk && k0 + j < key_end) {
                    s = scores[i] * p.scale;
{{MASK}}
                }
                scores[i] = s;
                mt = max(mt, s);
            }
            part[li] = mt;
        }
        workgroupBarrier();
        if (sr < BQ) {
            mt = row_m[sr];
            for (var t = 0u; t < TPR; t = t + 1u) {
                mt = max(mt, part[sr * TPR + t]);
            }
        }
        workgroupBarrier();  // every lane has read the maxima before they become sums
        if (sr < BQ) {
            var lt = 0.0;
            for (var i = 0u; i < KPT; i = i + 1u) {
                let j = st + i * TPR;
                if (j < BK) {
                    let s = scores[i];
                    let w = select(0.0, exp(s - mt), s != MAX_INIT);  // a NaN score stays NaN
                    s_tile[sr][j] = w;
                    lt = lt + w;
                }
            }
            part[li] = lt;
        }
        workgroupBarrier();
        if (sr < BQ && st == 0u) {
            var lt = 0.0;
            for (var t = 0u; t < TPR; t = t + 1u) {
                lt = lt + part[sr * TPR + t];
            }
            let corr = exp(row_m[sr] - mt);
            row_corr[sr] = corr;
            row_l[sr] = row_l[sr] * corr + lt;
            row_m[sr] = mt;
        }
        workgroupBarrier();
        if (orow < BQ) {
            acc = acc * row_corr[orow];
            // four independent sums (BK is a multiple of 4); weights past nk are 0 (and V rows
            // zero) up to BK
            var a0 = vec4<f32>();
            var a1 = vec4<f32>();
            var a2 = vec4<f32>();
            var a3 = vec4<f32>();
            for (var j = 0u; j < nk; j = j + 4u) {
                a0 = a0 + s_tile[orow][j] * v_tile[j][col];
                a1 = a1 + s_tile[orow][j + 1u] * v_tile[j + 1u][col];
                a2 = a2 + s_tile[orow][j + 2u] * v_tile[j + 2u][col];
                a3 = a3 + s_tile[orow][j + 3u] * v_tile[j + 3u][col];
            }
            acc = acc + ((a0 + a1) + (a2 + a3));
        }
    }
    workgroupBarrier();
    let qi = q0 + orow;
    if (orow < BQ && qi < p.seq) {
        var o = acc / row_l[orow];
{{MASKED_ROWS}}
        store_out((row0 + qi) * p.nh * HD + h * HD, col, o);
    }
}
