// matmul.wgsl hooks for FusedLayerNormMatMul: C = epilogue(LayerNorm(x, gamma, beta) op W)
// (Ba et al. 2016, biased variance; ir/ops/matmul.py). Before the K loop the workgroup takes the
// mean and 1 / sqrt(var + eps) of each of its BM rows over all of K (LN_LANES invocations a row,
// sums of x - x[row, 0], shifted by the row's first element so that a large mean does not cancel
// the variance; split-K workgroups take whole rows too), in the slices' memory, free until the first
// slice is stored. Load r of invocation li reads quads of tile row (li + WG r) / KQ only, so it keeps
// that row's statistics in stat[r], and the A slice stages (x - mean) * rstd * gamma + beta for 4 elements
// of the row (0 past K). Rows are not scaled after the product.

const LN_LANES: u32 = WG / BM;  // invocations that sum one row (>= 1: the kernel builder refuses fewer invocations)

// stat[r]: (x[row, 0], mean - x[row, 0], rstd) of tile row (li + WG r) / KQ: the mean is never rounded to one
// float, so that a row of a large mean and a small spread keeps its low bits
var<private> stat: array<vec3<f32>, A_LOADS>;

fn inside(k: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(k, k + 1u, k + 2u, k + 3u) < vec4<u32>(p.k));
}


// Called before the first slice is loaded, in uniform control flow.
fn start_rows(li: u32, row0: u32) {
    for (var u = li; u < BM * LN_LANES; u = u + WG) {  // unit u: row u % BM, lane u / BM
        let row = row0 + u % BM;
        let shift = quad_a(row, 0u).x;  // rows past M read zeros throughout
        var s1 = 0.0;
        var s2 = 0.0;
        for (var k = u / BM * 4u; k < p.k; k = k + 4u * LN_LANES) {
            let d = (quad_a(row, k) - vec4<f32>(shift)) * inside(k);
            s1 = s1 + d.x + d.y + d.z + d.w;
            s2 = s2 + dot(d, d);
        }
        tiles[u] = vec4<f32>(s1, s2, shift, 0.0);
    }
    workgroupBarrier();
    if (li < BM) {
        var s1 = 0.0;
        var s2 = 0.0;
        for (var l = 0u; l < LN_LANES; l = l + 1u) {
            let t = tiles[l * BM + li];
            s1 = s1 + t.x;
            s2 = s2 + t.y;
        }
        let d = s1 / f32(p.k);  // mean - shift
        let variance = max(s2 / f32(p.k) - d * d, 0.0);
        tiles[BM * LN_LANES + li] = vec4<f32>(tiles[li].z, d, 1.0 / sqrt(variance + p.eps), 0.0);
    }
    workgroupBarrier();
    for (var r = 0u; r < A_LOADS; r = r + 1u) {
        let row = min((li + WG * r) / KQ, BM - 1u);  // a load past the slice's quads stages nothing
        stat[r] = tiles[BM * LN_LANES + row].xyz;
    }
    workgroupBarrier();
}

// gamma_quad(k), beta_quad(k) (matmul.wgsl's NORM_QUADS, ir/ops/matmul_kernel.py): weights k..k+3, read as
// one vec4 where K % 4 == 0; past K the element is zeroed by inside().
fn stage_a(v: vec4<f32>, k: u32, r: u32) -> vec4<f32> {
    let centred = (v - vec4<f32>(stat[r].x)) - vec4<f32>(stat[r].y);
    return fma(centred, vec4<f32>(stat[r].z) * gamma_quad(k), beta_quad(k)) * inside(k);
}

fn finish_rows(li: u32) {}

fn row_scale(tile_row: u32) -> f32 {
    return 1.0;
}

fn write_row_sums(li: u32, row0: u32, at: u32) {}
