//#include "common.wgsl"
//#include "arith.wgsl"
//#include "derivatives.wgsl"
// (arith and derivatives: the helpers of generated epilogue regions, ir/ops/fused_epilogue.py)
//#include "matmul_gemv_reduce.wgsl"
// C[M,N] = epilogue(op(A) @ op(B)) for M <= 4 (decode), 'BT' up to 16: the GEMV form of matmul.wgsl,
// chosen by ir/ops/matmul_kernel.py (matmul_tile). A GEMV reads each element of B once
// and does 2 flops with it, so it is bound by memory bandwidth: the kernel keeps many
// vec4 loads of B in flight and spends nothing on staging.
//
// A workgroup of 256 invocations computes COLS output columns for ROWS rows: all M rows, or one of ROW_BLOCKS
// blocks of ROWS rows ('BT' products of more rows: ir/ops/matmul_kernel.py GEMV_ROW_BLOCK; neighbouring
// workgroups take the row blocks of one block of columns, so that they read its weights together). Its
// invocations are COLS-or-COLS/4 column owners times LANES lanes that split K in quads
// (4 consecutive k), lane l taking quads l, l + LANES, l + 2 * LANES, ... (two per step; for
// quantised B see LANE_K below):
// - B_ALONG_K ('BT': B stored [N,K], weights in the LLM layout): COLS columns
//   (ir/ops/matmul_kernel.py gemv_bt_cols), LANES = 256 / COLS; invocation li owns column
//   li / LANES as lane li % LANES; a quad of B is one row of it, so a warp reads 512
//   contiguous bytes per load. Each accumulator holds 4 partial dot products.
// - otherwise (B stored [K,N]): 32 columns as 8 quads, LANES = 32; invocation li owns columns
//   (li % 8) * 4 .. +3 as lane li / 8, and reads 4 rows of B (k .. k+3) per step, 8
//   invocations covering 128 contiguous bytes of each. Each accumulator holds 4 columns.
// The lanes of a column are then added ('BT': two rows of C at a time, else one; lanes_sum: a
// tree of log2(LANES) steps in workgroup memory, matmul_gemv_reduce.wgsl, or on devices with
// usable subgroups, where a column's lanes fit in one, log2(LANES) subgroup shuffles,
// matmul_gemv_reduce_subgroup.wgsl), and lane 0 stores through the epilogue.
//
// Template slots: ROWS (M, or a row block's rows), ROW_BLOCKS, COLS, LANES, B_ALONG_K; CHUNK (steps per
// chunk of K, 'BT') and the chunk's unrolled code LOAD_B (declares w0.. and loads them), RELOAD_B (loads the next chunk)
// and FMA_B; SUMS_BT ('BT') the calls of store_rows, one per pair of rows (unrolled with constant
// indices into acc and stat, or a loop: ir/ops/matmul_kernel.py GEMV_UNROLL_MIN_ROWS); DECODE, QUADS
// and EPILOGUE as in matmul.wgsl, except that quad_a(i, k) reads op(A)'s row i along K. LANE_K is
// a lane's first k and K2 the offset of its second quad: for f32, quads l and l + LANES (lane * 4,
// 4 * LANES), so a warp reads 512 contiguous bytes per load; for quantised B (blocks of 32 along K), lane l takes block l / 4 of the step's LANES / 4
// and in it the quads j = l % 4 * 4 and j + 16 (K2 16), which a 4-bit block keeps in the low and
// high nibbles of one word, so both quads share the block's scale and its word of nibbles.
// W_NORM: with the RmsNorm prologue, w_norm_quad(k), weights k..k+3 of its w_norm (binding w_norm
// vec4<f32> where K % 4 == 0, else f32), else empty.
// PROLOGUE defines stage_x (the quad used for 4 elements of a row of op(A) at column k),
// row_stat (a lane's share of a statistic of a row of op(A), summed over its quads as loaded,
// when ROW_STAT) and row_scale (the factor of a row of C, from the row's statistic summed over
// all K): matmul_gemv_prologue_none.wgsl or matmul_gemv_prologue_rms_norm.wgsl.

const ROWS: u32 = {{ROWS}}u;
const ROW_BLOCKS: u32 = {{ROW_BLOCKS}}u;
const COLS: u32 = {{COLS}}u;
const B_ALONG_K: bool = {{B_ALONG_K}};
const LANES: u32 = {{LANES}}u;  // invocations per column ('BT': 256 / COLS), else 32
const CHUNK_K: u32 = {{CHUNK}}u * 8u * LANES;  // K per chunk of steps ('BT')

var<workgroup> red: array<vec4<f32>, 256>;

{{DECODE}}

{{QUADS}}

{{W_NORM}}

{{PROLOGUE}}

fn epilogue(i: u32, j: u32, acc: f32) -> f32 {
    var v = acc;
{{EPILOGUE}}
    return v;
}

// 'BT': rows i and i + 1 (of C) of column col from a lane's accumulators (a, b) and row statistics (sa, sb): one
// column per lane, so the dot products and statistics of the two rows share one lane sum (dot, stat of
// row i, then of row i + 1); lane 0 stores them. The last row of a block of an odd count passes its own twice
// (pair false): only one is stored. Rows past M are not stored.
fn store_rows(li: u32, lane: u32, col: u32, i: u32, a: vec4<f32>, sa: f32, b: vec4<f32>, sb: f32, pair: bool) {
    let total = lanes_sum(li, lane, 1u, vec4<f32>(a.x + a.y + a.z + a.w, sa, b.x + b.y + b.z + b.w, sb));
    if (lane == 0u && col < p.n && i < p.m) {
        out[i * p.n + col] = epilogue(i, col, total.x * row_scale(total.y));
        if (pair && i + 1u < p.m) {
            out[(i + 1u) * p.n + col] = epilogue(i + 1u, col, total.z * row_scale(total.w));
        }
    }
}

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let group = linear_workgroup(wid, nwg);
    if (group >= p.tiles) {
        return;
    }
    let row0 = group % ROW_BLOCKS * ROWS;  // the workgroup's first row
    let columns = group / ROW_BLOCKS;  // and block of columns
    let lane = select(li / 8u, li % LANES, B_ALONG_K);
    let stride = select(8u, 1u, B_ALONG_K);  // invocations between neighbouring lanes
    let col = select(columns * COLS + li % 8u * 4u, columns * COLS + li / LANES, B_ALONG_K);
    var acc: array<vec4<f32>, ROWS>;
    var stat: array<f32, ROWS>;  // row_stat of the quads of op(A) this lane loads
    if (B_ALONG_K) {
        // K in chunks of CHUNK steps of two quads per lane: a chunk's loads of B are issued
        // together, then its FMAs run (both unrolled in ir/ops/matmul_kernel.py, since the NVIDIA
        // driver does not unroll a loop over a run-time K itself). Past K, quads load as zeros.
        let lane_k = {{LANE_K}};
        var k0 = lane_k;
{{LOAD_B}}
        for (var c = 0u; c < p.k; c = c + CHUNK_K) {
            k0 = lane_k + c;
            if (c > 0u) {
{{RELOAD_B}}
            }
{{FMA_B}}
        }
    } else {
        for (var k = {{LANE_K}}; k < p.k; k = k + 8u * LANES) {
            // two quads of K per lane and step: their loads are independent, so both are in
            // flight at once (past K, quads load as zeros)
            let k2 = k + {{K2}};
            let w0 = quad_b(k, col);
            let w1 = quad_b(k + 1u, col);
            let w2 = quad_b(k + 2u, col);
            let w3 = quad_b(k + 3u, col);
            let w4 = quad_b(k2, col);
            let w5 = quad_b(k2 + 1u, col);
            let w6 = quad_b(k2 + 2u, col);
            let w7 = quad_b(k2 + 3u, col);
            for (var i = 0u; i < ROWS; i = i + 1u) {
                let xa = quad_a(row0 + i, k);
                let ya = quad_a(row0 + i, k2);
                stat[i] = stat[i] + row_stat(xa) + row_stat(ya);
                let x = stage_x(xa, k);
                let y = stage_x(ya, k2);
                acc[i] = fma(vec4<f32>(x.x), w0, fma(vec4<f32>(x.y), w1,
                         fma(vec4<f32>(x.z), w2, fma(vec4<f32>(x.w), w3, acc[i]))));
                acc[i] = fma(vec4<f32>(y.x), w4, fma(vec4<f32>(y.y), w5,
                         fma(vec4<f32>(y.z), w6, fma(vec4<f32>(y.w), w7, acc[i]))));
            }
        }
    }
    if (B_ALONG_K) {
{{SUMS_BT}}
    } else {
        for (var i = 0u; i < ROWS; i = i + 1u) {  // one row at a time
            let total = lanes_sum(li, lane, stride, acc[i]);  // valid in lane 0
            var row_total = 0.0;
            if (ROW_STAT) {
                row_total = lanes_sum(li, lane, stride, vec4<f32>(stat[i])).x;
            }
            if (lane == 0u && row0 + i < p.m) {
                let v = total * row_scale(row_total);
                for (var e = 0u; e < 4u; e = e + 1u) {
                    if (col + e < p.n) {
                        out[(row0 + i) * p.n + col + e] = epilogue(row0 + i, col + e, v[e]);
                    }
                }
            }
        }
    }
}
