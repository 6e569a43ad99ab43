//#include "common.wgsl"
// Scaled dot-product attention with GQA for FullAttention, CausalAttention and
// CausalAttentionRoPE (Vaswani et al. 2017, eq. 1; ir.ops.attention_reference), tiled as
// FlashAttention (Dao et al. 2022, alg. 1): a workgroup of BQ invocations takes BQ query
// rows of one (sequence, head), one row per invocation, with q, the running max m, the
// sum l and acc[HD] in registers. K and V tiles of BK keys x HD are loaded cooperatively
// (coalesced, vec4 when HD % 4 == 0) into workgroup memory; each invocation scores its
// row against the whole tile, takes the tile's max and rescales acc once per tile
// (online softmax, Milakov & Gimelshein 2018), so no score matrix is stored.
// Rows hold `batch` sequences of `seq` rows each; q and out are [rows, nh * HD], k and v
// [rows, nkv * HD]; query head h reads kv head h / group. Vectors are zero-padded to HD4
// vec4s, so any HD works; padding adds 0 to every dot product and is never written.
// Template slots: HEAD_DIM, BQ (query rows = invocations per workgroup), BK (keys per
// tile; 2 BK HD4 16 bytes fit maxComputeWorkgroupStorageSize); MASK_BINDING and MASK
// (key_mask [batch, seq]: a masked score becomes MASK_SENTINEL, so a fully masked row
// averages all values, as in the reference); KEY_END (keys of row qi: seq, or qi + 1 for
// causal) and TILES_END (keys any row of the block reads: causal stops at the diagonal);
// QK defines the hooks load_q (a query row into registers) and prepare_k_tile (after the
// K tile is loaded), attention_qk.wgsl or, for CausalAttentionRoPE, attention_qk_rope.wgsl,
// whose uniform fields ROPE_PARAMS adds. IO declares the q, k, v storage bindings with
// their accessors NAME4(row_base, c) (vec4 c of a row) and NAME1(i) (element i), and the
// output's store_out (lowering.kernels._attention_io); Q, K, V name the arrays read (one
// packed [rows, (nh + 2 nkv) * HD] projection, read through the strides and offsets).

const HD: u32 = {{HEAD_DIM}}u;
const HD4: u32 = (HD + 3u) / 4u;
const BQ: u32 = {{BQ}}u;
const BK: u32 = {{BK}}u;

struct Params {
{{ROPE_PARAMS}}
    seq: u32,
    nh: u32,
    nkv: u32,
    group: u32,     // nh / nkv
    q_blocks: u32,  // ceil(seq / BQ)
    total: u32,     // batch * nh * q_blocks workgroups
    scale: f32,     // 1 / sqrt(HD)
    q_stride: u32,  // elements per row of q (nh * HD, or the packed width)
    kv_stride: u32, // elements per row of k and v (nkv * HD, or the packed width)
    k_off: u32,     // column of k's first element in its row (0, or nh * HD when packed)
    v_off: u32,     // column of v's first element (0, or (nh + nkv) * HD when packed)
}

{{IO}}
{{MASK_BINDING}}
@group(0) @binding({{UNIFORM}}) var<uniform> p: Params;

var<workgroup> k_tile: array<vec4<f32>, BK * HD4>;
var<workgroup> v_tile: array<vec4<f32>, BK * HD4>;

{{QK}}

@compute @workgroup_size(BQ)
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
    let qi = q0 + li;  // past seq on the last block: loads tiles, writes nothing
    var qv: array<vec4<f32>, HD4>;
    var acc: array<vec4<f32>, HD4>;
    var sc: array<f32, BK>;
    if (qi < p.seq) {
        load_q(&qv, (row0 + qi) * p.q_stride + h * HD, qi);
    }
    let key_end = {{KEY_END}};
    let tiles_end = {{TILES_END}};
    var m = MAX_INIT;
    var l = 0.0;
    for (var k0 = 0u; k0 < tiles_end; k0 = k0 + BK) {
        let nk = min(BK, tiles_end - k0);
        workgroupBarrier();  // every invocation is done with the previous tile
        for (var i = li; i < nk * HD4; i = i + BQ) {
            let base = (row0 + k0 + i / HD4) * p.kv_stride + kh * HD;
            k_tile[i] = {{K}}4(base + p.k_off, i % HD4);
            v_tile[i] = {{V}}4(base + p.v_off, i % HD4);
        }
        workgroupBarrier();
        prepare_k_tile(li, k0, nk);
        // This row's keys in the tile: 0 once the causal diagonal is behind it.
        let kn = min(nk, key_end - min(key_end, k0));
        var mt = m;
        for (var j = 0u; j < BK; j = j + 1u) {
            if (j < kn) {
                var s = 0.0;
                for (var c = 0u; c < HD4; c = c + 1u) {
                    s = s + dot(qv[c], k_tile[j * HD4 + c]);
                }
                s = s * p.scale;
{{MASK}}
                sc[j] = s;
                mt = max(mt, s);
            }
        }
        let corr = exp(m - mt);
        l = l * corr;
        for (var c = 0u; c < HD4; c = c + 1u) {
            acc[c] = acc[c] * corr;
        }
        for (var j = 0u; j < BK; j = j + 1u) {
            if (j < kn) {
                let w = exp(sc[j] - mt);
                l = l + w;
                for (var c = 0u; c < HD4; c = c + 1u) {
                    acc[c] = acc[c] + w * v_tile[j * HD4 + c];
                }
            }
        }
        m = mt;
    }
    if (qi < p.seq) {
        let inv = 1.0 / l;
        let o_base = (row0 + qi) * p.nh * HD + h * HD;
        for (var c = 0u; c < HD4; c = c + 1u) {
            store_out(o_base, c, acc[c] * inv);
        }
    }
}
