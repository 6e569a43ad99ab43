//#include "common.wgsl"
// Scaled dot-product attention with GQA for FullAttention, FullAttentionPacked, CausalAttention,
// CausalAttentionRoPE (Vaswani et al. 2017, eq. 1; ir/ops/attention.py attention_reference) and GeneralAttention
// without causality, windows, softcap or kv lengths (ir/ops/attention_general.py) with a query row's state in
// registers: a workgroup of WG = R / P * L invocations takes R query rows of one (sequence, head), L
// lanes to a row, P rows to a lane. Lane t of row r keeps the row's q (pre-scaled by scale * log2(e))
// and its own online-softmax state (Milakov & Gimelshein 2018: running maximum m, sum l, output o) in
// registers, and scores keys t, t + L, ... of each K/V tile of BK keys in workgroup memory, all
// R rows reading the same tile (FlashAttention's tiling, Dao et al. 2022, alg. 1, with the keys
// of a tile split over the lanes instead of the rows over the head's columns). So a tile costs two
// barriers (load, use; three with RoPE) and no exchange between invocations; the L lanes' states are
// merged once at the end (m by a maximum; l and o rescaled by exp2(m_lane - M); o summed in log2(L)
// halving steps through workgroup memory, l by lane 0 from lane_l) and lane 0 stores the row. Against
// attention.wgsl, whose tile phases exchange maxima, sums and weights through workgroup memory (six
// barriers a tile, seven with RoPE), this trades barriers for registers: the lowering takes it for
// ir/ops/attention.py LANES_OPS up to LANES_MAX_HEAD_DIM (lane_tiles).
// Rows hold `batch` sequences of `seq` rows each; q and out are [rows, nh * HD], k and v
// [rows, nkv * HD] (or one packed projection, read through strides and offsets); query head h
// reads kv head h / group. Vectors are zero-padded to HD4 vec4s. Scores use exp2 of log2(e)-scaled
// logits, which equals the reference's softmax up to rounding. Keys a row may not see (past the
// causal diagonal or the sequence) score MAX_INIT and weigh 0; a key masked by key_mask scores
// MASK_SENTINEL, so a fully masked row averages all values, as in the reference, or with masked_rows
// "zero" is stored as zeros (STORE: the row's maximum is then MASK_SENTINEL); a causal row that keeps no
// key is stored as MEAN_V's mean_v, the mean of v over all the sequence's keys (masked_rows "mean").
// CausalAttentionRoPE: Q_TILE declares the Q block in workgroup memory (q_tile, BQ = R rows), which
// Q_PREPARE loads and rotates (attention_qk_rope.wgsl's prepare_q_tile, included by QK) before the
// lanes read their rows from it, and K_PREPARE rotates each K tile in place (prepare_k_tile);
// without RoPE the three are empty and q is read from the q binding.
// Template slots: HEAD_DIM, ROWS (R), LANES (L, a power of two), BK (a multiple of L), PER_LANE (P,
// dividing R: each K and V read from workgroup memory serves P rows); ROW_SETUP, SCORE_DOTS,
// SOFTMAX_PV, MERGE_STATS, REDUCE_WRITE, REDUCE_ADD, STORE: the per-row, per-quad and per-key
// statements over named registers (ir/ops/attention.py lanes_slots);
// MASK_LOAD (masked: the tile's key_mask flags into k_masked; key_mask is f32, i32 or a bool's u32,
// ir/ops/attention.py key_dropped_wgsl); KEY_END (keys row qi sees: p.seq,
// or qi + 1u for causal) and TILES_END (keys any row of the block sees); IO the accessors of
// the bindings (ir/ops/attention.py attention_io), K and V the arrays read; ROW0 the first row of the
// (sequence, head) where rows are counted over sequences, KV_BASE the element of key k0 + i / HD4's row
// in K and V before p.k_off and p.v_off (ir/ops/attention.py LaneAddressing).
// GeneralAttention (ir/ops/attention_general.py _general_lanes_kernel) addresses q, k, v and out through its
// (batch, head, row) strides instead, reads its additive or bool mask where ROW_SETUP and SOFTMAX_PV score a key
// (SCORE_FN: the function they call), and KEY_END and TILES_END are the keys its mask covers. EXP and LOG2E:
// the weights are EXP(s - m) of scores scaled by LOG2E (exp2 and log2(e); GeneralAttention: exp and 1, so that
// a mask value added to a score keeps the f32 range the reference has).

const HD: u32 = {{HEAD_DIM}}u;
const HD4: u32 = (HD + 3u) / 4u;
const R: u32 = {{ROWS}}u;
const L: u32 = {{LANES}}u;
const BK: u32 = {{BK}}u;
const P: u32 = {{PER_LANE}}u;  // query rows of each lane
const WG: u32 = R / P * L;
const HALF: u32 = max(L / 2u, 1u);  // lanes that write their state in the first merge step
const KS: u32 = HD4 + 1u;  // vec4s from one K or V row to the next (padded: the lanes of a row read consecutive keys)

{{IO}}

var<workgroup> k_tile: array<array<vec4<f32>, KS>, BK>;
var<workgroup> v_tile: array<array<vec4<f32>, KS>, BK>;
var<workgroup> k_masked: array<f32, BK>;  // 1.0 where key_mask drops the tile's key
var<workgroup> lane_m: array<f32, R * L>;
var<workgroup> lane_l: array<f32, R * L>;
var<workgroup> merge: array<array<vec4<f32>, HD4>, R * HALF>;
{{Q_TILE}}
{{QK}}

fn key_end_of(qi: u32) -> u32 {
    return {{KEY_END}};
}
{{MEAN_V}}
{{SCORE_FN}}

// A lane's weight of one score against the running maximum mt (0 for a key it may not see).
fn weight(s: f32, mt: f32) -> f32 {
    return select(0.0, {{EXP}}(s - mt), s != MAX_INIT);
}

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
{{ROW0}}
    let q0 = qb * R;
    let g = li / L;  // the lane's row group: rows g * P + u of the block, u < P
    let lane = li % L;
    let qs = p.scale * {{LOG2E}};  // log2(e): weights by exp2 (GeneralAttention: 1, weights by exp)
{{Q_PREPARE}}
{{ROW_SETUP}}
    let tiles_end = {{TILES_END}};
    for (var k0 = 0u; k0 < tiles_end; k0 = k0 + BK) {
        let nk = min(BK, tiles_end - k0);
        workgroupBarrier();  // every invocation is done with the previous tile
        for (var i = li; i < BK * HD4; i = i + WG) {
            var kv = vec4<f32>();
            var vv = vec4<f32>();
            if (i / HD4 < nk) {
                let base = {{KV_BASE}};
                kv = {{K}}4(base + p.k_off, i % HD4);
                vv = {{V}}4(base + p.v_off, i % HD4);
            }
            k_tile[i / HD4][i % HD4] = kv;
            v_tile[i / HD4][i % HD4] = vv;
        }
{{MASK_LOAD}}
        workgroupBarrier();
{{K_PREPARE}}
        // the lane's BK / L scores side by side (a key past the tile reads a zero row; its score is
        // dropped), each of q's quads read once for all of them
{{SCORE_DOTS}}
{{SOFTMAX_PV}}
    }
    // merge the lanes of each row: rescale to the row's maximum, then halve the lanes holding a
    // partial state until lane 0 holds the row's
{{MERGE_STATS}}
    for (var step = HALF; step >= 1u && L > 1u; step = step / 2u) {
        workgroupBarrier();
        if (lane >= step && lane < 2u * step) {
{{REDUCE_WRITE}}
        }
        workgroupBarrier();
        if (lane < step) {
{{REDUCE_ADD}}
        }
    }
    workgroupBarrier();
    if (lane == 0u) {
{{STORE}}
    }
}
