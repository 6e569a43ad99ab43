//#include "common.wgsl"
// C[z, m, n] = sum_k A(z, m, k) B(z, k, n), 0 <= m < p.m, k < p.k, n < p.n: the tiled kernel of
// BatchMatMul (batch_matmul.wgsl) and of Conv / ConvTranspose as implicit GEMMs
// (conv_gemm.wgsl; ir/ops/linalg.py, ir/ops/conv.py). The file that includes this one defines
// the operand accessors:
//   gemm_begin(z, col)  called first, once: z the problem (batch, or image and group), col
//                       the first of the 4 consecutive columns of B this invocation loads
//   load_a(m, k)        an element of A, called only inside the problem
//   load_b4(k)          elements (k, col .. col + 3) of B, zero past p.n; k < p.k
//   out_row(m), out_col(n)  where result (m, n) goes: out[out_row(m) + out_col(n)], so each
//                       invocation computes its 4 rows' and 4 columns' parts once
//   finish(m, at, v)    the value stored at out[at] for result v of row m
//
// One workgroup of 256 invocations computes a BM x BN tile of C (BM * BN = 4096: 64 x 64,
// 32 x 128 or 16 x 256, chosen per problem). Invocation (tx, ty), tx = li % TX, owns the
// 4 x 4 outputs at rows ty * 4 .. + 3 and columns tx * 4 .. + 3 of the tile. K is walked in
// slices of SLICE (16, or 8 for 16 x 256, so that 4 SLICE (BM + BN) bytes stay within the
// 16384 of workgroup memory every WebGPU device has), both operands staged in workgroup
// memory as vec4 (A transposed: [SLICE][BM / 4], B [SLICE][BN / 4]), so the inner product
// reads one vec4 of each per step. Element e = li + 256 r of A's slice is row e / SLICE,
// column e % SLICE (neighbouring invocations read neighbouring k); quad q = li + 256 r of B's
// is slice row q / TX, the tile's quad column li % TX (the same for every r, as TX divides
// 256). Elements outside the problem load as zeros.
// STORE writes the 4 x 4 results: through out_row, out_col and finish, element by element
// (ir/ops/linalg.py GEMM_STORE), or, for a row-major C of N % 4 == 0, each row's quad as one
// vec4 (GEMM_STORE_QUADS: out bound as vec4, finish the identity).
// Workgroups are numbered tile column fastest, then tile row, then z (p.tiles_n,
// p.tiles_m); past p.tiles (a split grid) a workgroup returns at once.

const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const SLICE: u32 = {{SLICE}}u;
const TX: u32 = BN / 4u;  // invocations across the tile, each 4 columns
const BM4: u32 = BM / 4u;
const A_ELEMS: u32 = BM * SLICE;  // elements of A's slice
const B_QUADS: u32 = SLICE * TX;  // quads of B's slice
const A_LOADS: u32 = (A_ELEMS + 255u) / 256u;  // rounds of staging
const B_LOADS: u32 = (B_QUADS + 255u) / 256u;
const B_ROWS: u32 = 256u / TX;  // slice rows of B staged per round

var<workgroup> a_tile: array<vec4<f32>, SLICE * BM4>;  // a_tile[k * BM4 + m / 4][m % 4]
var<workgroup> b_tile: array<vec4<f32>, SLICE * TX>;   // b_tile[k * TX + n / 4]

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let t = linear_workgroup(wid, nwg);
    if (t >= p.tiles) {
        return;
    }
    let n0 = (t % p.tiles_n) * BN;
    let m0 = ((t / p.tiles_n) % p.tiles_m) * BM;
    let z = t / (p.tiles_n * p.tiles_m);
    let tx = li % TX;
    let ty = li / TX;
    let b_q = li % TX;  // the quad of B columns this invocation stages
    gemm_begin(z, n0 + 4u * b_q);
    var c0 = vec4<f32>();
    var c1 = vec4<f32>();
    var c2 = vec4<f32>();
    var c3 = vec4<f32>();
    for (var k0 = 0u; k0 < p.k; k0 = k0 + SLICE) {
        for (var r = 0u; r < A_LOADS; r = r + 1u) {
            let e = li + 256u * r;
            let am = e / SLICE;
            let ak = e % SLICE;
            var va = 0.0;
            if (e < A_ELEMS && m0 + am < p.m && k0 + ak < p.k) {
                va = load_a(m0 + am, k0 + ak);
            }
            if (e < A_ELEMS) {
                a_tile[ak * BM4 + am / 4u][am % 4u] = va;
            }
        }
        for (var r = 0u; r < B_LOADS; r = r + 1u) {
            let bk = li / TX + B_ROWS * r;
            var vb = vec4<f32>();
            if (bk < SLICE && k0 + bk < p.k) {
                vb = load_b4(k0 + bk);
            }
            if (bk < SLICE) {
                b_tile[bk * TX + b_q] = vb;
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < SLICE; kk = kk + 1u) {
            let a = a_tile[kk * BM4 + ty];
            let b = b_tile[kk * TX + tx];
            c0 = fma(vec4<f32>(a.x), b, c0);
            c1 = fma(vec4<f32>(a.y), b, c1);
            c2 = fma(vec4<f32>(a.z), b, c2);
            c3 = fma(vec4<f32>(a.w), b, c3);
        }
        workgroupBarrier();
    }
    let acc = array<vec4<f32>, 4>(c0, c1, c2, c3);
{{STORE}}
}
