//#include "common.wgsl"
//#include "arith.wgsl"
//#include "derivatives.wgsl"
// (arith and derivatives: the helpers of generated epilogue regions, ir/ops/fused_epilogue.py)
// C[M,N] = epilogue(op(A) @ op(B)) for MatMul, MatMulAT, MatMulBT, FusedMatMul and
// FusedRmsNormMatMul: the tiled kernel (ir/ops/matmul_kernel.py; M <= 4, and 'BT' products of up to 16
// rows where gemv_bt_rows says, take matmul_gemv.wgsl).
//
// One workgroup of WG invocations (256; 128 and 64 for ir/ops/matmul_kernel.py's MATMUL_TILES_SMALL, 192 and
// 96 for MATMUL_TILES_THREE_QUARTER)
// computes a BM x BN tile of C. They form KSPLIT groups
// of TX x TY invocations; invocation (tx, ty) of a group owns rows g*4*TY + ty*4 + (0..3)
// and columns h*4*TX + tx*4 + (0..3) of the tile (g < TM/4, h < TN/4): a TM x TN
// micro-tile (8x8 for 128x128) of vec4 accumulators c{row}_{h}, updated with one vec4
// FMA per row and column group (or, ir/ops/matmul_kernel.py micro_tile_form, d{column}_{g},
// a vec4 per column and row group, gathered into the c{row}_{h} after the K loop). K is walked
// in slices of BK: A's slice is staged
// transposed ([BK][BM], so the inner loop reads 4 rows of A as one vec4) and B's as is
// ([BK][BN]), in two buffers: while the workgroup computes on one, each invocation holds
// its quads (4 consecutive stored elements; quads li, li + WG, ... of a slice, as many as
// MatmulTile.loads in ir/ops/matmul_kernel.py) of the next slice in registers, stores them
// into the other buffer after the inner product, and a single barrier per slice separates
// the two (with ir/ops/matmul_kernel.py's PIPELINE_STAGES = 3, two sets of registers, each
// slice's quads loaded two slices ahead, the loop doing two slices an iteration). K group kg
// takes elements [kg, kg + 1) * BK / KSPLIT of each slice; small tiles
// (KSPLIT 2 or 4) thus keep WG invocations busy, and wide micro-tiles (8x4, 4x8 or 8x8,
// MATMUL_TILES_WIDE: KSPLIT 2 to 8) read fewer vec4 of workgroup memory per FMA; the groups' sums
// are added in workgroup memory at the end (REDUCE_SPLIT, in rounds of as many accumulators
// as the slices' memory holds), each group adding and storing its share of the accumulators
// (accumulator j: group j % KSPLIT; the STORE lines name the group).
//
// Template slots (filled by ir/ops/matmul_kernel.py): BM, BN, BK, TM, TN the tile, WG its invocations; the
// bindings a and b hold vec4<f32> when the operand's stored rows are a multiple of 4 long,
// else f32 (the RmsNorm weight sits between them, the epilogue operands e0, e1, ... follow
// b); QUADS defines quad_a(r, c) and quad_b(r, c), the stored elements (r, c..c+3), zero
// outside the matrix (DECODE: empty, or for quantised B, ir/ops/quant.py, the block decoders of
// quant_decode.wgsl, which quad_b calls on the u32 binding q); A_ALONG_K (false for 'AT',
// whose A is stored [K,M]) and B_ALONG_K (true for 'BT', whose B is stored [N,K]) say
// along which dimension a stored row of each operand runs; ACCUMULATORS, REDUCE_SPLIT and
// STORE are the unrolled micro-tile; EPILOGUE is the chain applied to each result; K_LOOP is
// the K loop (ir/ops/matmul_kernel.py _k_loop): the unrolled loads and stores of each
// invocation's quads (next_a0, next_b0, ...) around the micro-tile's unrolled inner product.
// PROLOGUE defines the hooks stage_a (the quad
// staged for 4 elements of a row of A at column k, from the invocation's load r of the
// slice), start_rows (called once before the first slice is loaded, in uniform control flow),
// finish_rows (called once after the K loop, in uniform control flow), row_scale
// (a factor per tile row applied before the epilogue) and write_row_sums (SPLITS > 1: what
// the reduction needs to compute row_scale; NORM_QUADS defines what the LayerNorm prologue reads of its
// weights, and is empty for the others):
// matmul_prologue_none.wgsl, matmul_prologue_rms_norm.wgsl for FusedRmsNormMatMul or
// matmul_prologue_layer_norm.wgsl for FusedLayerNormMatMul.
//
// SPLITS > 1 (split-K across workgroups, for products of few tiles): workgroup w computes
// tile w % tiles over K elements [s, s + 1) * k_chunk (s = w / tiles, k_chunk a multiple of BK)
// and stores its raw partial sums at out[(s * M + i) * N + j], then (FusedRmsNormMatMul) the
// partial sums of x^2 of its rows at out[SPLITS * M * N + s * M + i]: no row scale, no
// epilogue. matmul_split_reduce.wgsl adds the SPLITS partials and applies both. Or in one
// dispatch (LAST_SPLIT, ir/ops/matmul_kernel.py last_split): the partial sums go to the binding
// part instead, as u32 atomics, and the workgroup that finishes a tile's last K range adds them
// (split by split, in order: matmul_split_reduce.wgsl's sums), applies the epilogue and stores C.
// It knows itself by the tile's counter (count, u32s that are zero between dispatches): each
// workgroup stores its partial sums, then storageBarrier (in naga's SPIR-V a control barrier with
// device-scope acquire-release semantics), then one invocation adds 1; the workgroup that reads
// SPLITS - 1 passes a second storageBarrier, resets the counter and reads the others' sums. The
// sums are atomics because naga declares storage buffers without the Coherent decoration (GLSL450
// memory model), where a plain store of another workgroup need not become visible; WGSL itself
// gives barriers workgroup scope only, so this relies on how naga lowers them (see last_split; on
// Metal the lowering keeps two dispatches).
// No workgroup waits for another.
//
// Edge tiles need no separate path: quads past M, N or K load as zeros (a vec4 quad is
// wholly inside or outside, its row length being a multiple of 4) and the store checks
// each element (bound as vec4, N % 4 == 0: each quad, wholly inside or outside). Where the
// tiles cover the matrices exactly, the QUADS and STORE4 forms may leave those checks out
// (ir/ops/matmul_kernel.py inside_form).

const SPLITS: u32 = {{SPLITS}}u;
const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const BK: u32 = {{BK}}u;
const TX: u32 = BN / {{TN}}u;          // invocations across a K group's tile: TX x TY,
const TY: u32 = BM / {{TM}}u;          // each a {{TM}}x{{TN}} micro-tile
const WG: u32 = {{WG}}u;               // invocations of a workgroup
const KSPLIT: u32 = WG / (TX * TY);    // K groups
const BM4: u32 = BM / 4u;
const BN4: u32 = BN / 4u;
const KQ: u32 = BK / 4u;              // quads in BK elements of a row
const A_QUADS: u32 = BM * BK / 4u;    // quads in a slice of A
const B_QUADS: u32 = BN * BK / 4u;
const A_LOADS: u32 = (A_QUADS + WG - 1u) / WG;  // quads of a slice of A each invocation loads
const A_SIZE: u32 = BK * BM4;         // vec4 per A buffer
const B_SIZE: u32 = BK * BN4;
const B_START: u32 = 2u * A_SIZE;     // the B buffers follow the two A buffers
const A_ALONG_K: bool = {{A_ALONG_K}};
const B_ALONG_K: bool = {{B_ALONG_K}};

// [2][BK][BM / 4] slices of A, then [2][BK][BN / 4] slices of B.
var<workgroup> tiles: array<vec4<f32>, 2u * (A_SIZE + B_SIZE)>;

{{DECODE}}

{{QUADS}}

{{NORM_QUADS}}

{{PROLOGUE}}

fn epilogue(i: u32, j: u32, acc: f32) -> f32 {
    var v = acc;
{{EPILOGUE}}
    return v;
}

// Quad li of the A slice starting at k0 of the tile at row0 (zero for li >= A_QUADS).
fn load_a(li: u32, row0: u32, k0: u32) -> vec4<f32> {
    if (li >= A_QUADS) {
        return vec4<f32>();
    }
    if (A_ALONG_K) {  // quad li: tile row li / KQ, columns k0 + (li % KQ) * 4 ..
        let k = k0 + li % KQ * 4u;
        return stage_a(quad_a(row0 + li / KQ, k), k, li / WG);
    }
    return quad_a(k0 + li / BM4, row0 + li % BM4 * 4u);  // quad li: slice row li / BM4
}

fn load_b(li: u32, col0: u32, k0: u32) -> vec4<f32> {
    if (li >= B_QUADS) {
        return vec4<f32>();
    }
    if (B_ALONG_K) {
        return quad_b(col0 + li / KQ, k0 + li % KQ * 4u);
    }
    return quad_b(k0 + li / BN4, col0 + li % BN4 * 4u);
}

// Store a quad loaded along K as 4 elements of a column of the [BK][side] slice at `at`.
// The KQ quads of a row go to neighbouring invocations, which read the row's 4 * BK bytes
// together; their stores meet 2-way bank conflicts (neighbouring rows instead: no
// conflicts, but each warp reads half-sectors, and on an H200 it ran 3% slower at 4096^3,
// 15% at 1024^3).
fn store_transposed(at: u32, li: u32, side4: u32, v: vec4<f32>) {
    let m = li / KQ;
    let base = at + li % KQ * 4u * side4 + m / 4u;
    let e = m % 4u;
    tiles[base][e] = v.x;
    tiles[base + side4][e] = v.y;
    tiles[base + 2u * side4][e] = v.z;
    tiles[base + 3u * side4][e] = v.w;
}

fn store_a(li: u32, buf: u32, v: vec4<f32>) {
    if (li < A_QUADS) {
        if (A_ALONG_K) {
            store_transposed(buf * A_SIZE, li, BM4, v);
        } else {
            tiles[buf * A_SIZE + li] = v;
        }
    }
}

fn store_b(li: u32, buf: u32, v: vec4<f32>) {
    if (li < B_QUADS) {
        if (B_ALONG_K) {
            store_transposed(B_START + buf * B_SIZE, li, BN4, v);
        } else {
            tiles[B_START + buf * B_SIZE + li] = v;
        }
    }
}

var<private> part_base: u32;  // SPLITS > 1: where this workgroup's partial sums start in out

// store4(row0, col0, r, c, v): columns j..j+3 of row i = row0 + r (tile row r) of C, through the
// epilogue (SPLITS > 1: the partial sums, through put_part4 or put_part1); put_row_sum(at, v): the
// float out[at]. Both in the form of out's binding: ir/ops/matmul_kernel.py _STORE4_SCALAR, or
// _STORE4_VEC4 (out bound as vec4<f32>, one write a quad; N % 4 == 0). put_part4(at, v) and
// put_part1(at, v) store partial sums at element at of [SPLITS, M, N]: into out (_PART_OUT_*), or with
// LAST_SPLIT into part as u32 atomics (_PART_ATOMICS, with part4(at), the load of a quad), where
// finish4(row0, col0, r, c) stores the quad of C at tile row r, column c from the splits' partial sums,
// through the epilogue.
{{STORE4}}

@compute @workgroup_size({{WG}}, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let w = linear_workgroup(wid, nwg);
    if (w >= p.tiles * SPLITS) {
        return;
    }
    let tile = w % p.tiles;
    let split = w / p.tiles;
    let k0 = split * p.k_chunk;  // this workgroup's K elements: [k0, min(k0 + k_chunk, K))
    let k_end = min(p.k, k0 + p.k_chunk);
    part_base = split * p.m * p.n;
    let row0 = tile / p.tiles_n * BM;
    let col0 = tile % p.tiles_n * BN;
    let t = li % (TX * TY);  // invocation (tx, ty) of K group kg
    let kg = li / (TX * TY);
    let tx = t % TX;
    let ty = t / TX;
{{ACCUMULATORS}}
    start_rows(li, row0);
{{K_LOOP}}
{{REDUCE_SPLIT}}
    finish_rows(li);
    if (SPLITS > 1u && tile % p.tiles_n == 0u) {  // one workgroup per row block and split
        write_row_sums(li, row0, SPLITS * p.m * p.n + split * p.m);
    }
{{STORE}}
{{LAST_SPLIT}}
}
