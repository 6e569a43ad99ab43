//#include "gemm_tiled.wgsl"
// BatchMatMul (ir/ops/linalg.py): out[z] = A'[z] @ B'[z] through the tiled kernel of
// gemm_tiled.wgsl. z runs over the broadcast batch, whose (merged) dimensions are p.batch;
// matrix z of A starts at the element p.sa.z + sum_d index_d * p.a_batch[d] (0 where A
// broadcasts), likewise B from 0. Element (m, k) of A' is at m * p.sa.x + k * p.sa.y (A stored [M,K], or [K,M]
// when transposed), (k, n) of B' at k * p.sb.x + n * p.sb.y.

var<private> a_base: u32;
var<private> b_base: u32;
var<private> c_base: u32;
var<private> col0: u32;

fn gemm_begin(z: u32, col: u32) {
    var rest = z;
    a_base = p.sa.z;  // A's element offset (0, or a column window's start: PermutedBatchMatMul)
    b_base = 0u;
    for (var d = 3; d >= 0; d = d - 1) {
        let i = rest % p.batch[d];
        rest = rest / p.batch[d];
        a_base = a_base + i * p.a_batch[d];
        b_base = b_base + i * p.b_batch[d];
    }
    c_base = z * p.m * p.n;
    col0 = col;
}

fn load_a(m: u32, k: u32) -> f32 {
    return a[a_base + m * p.sa.x + k * p.sa.y];
}

fn load_b4(k: u32) -> vec4<f32> {
    var v = vec4<f32>();
    for (var e = 0u; e < 4u; e = e + 1u) {
        if (col0 + e < p.n) {
            v[e] = b[b_base + k * p.sb.x + (col0 + e) * p.sb.y];
        }
    }
    return v;
}

fn out_row(m: u32) -> u32 {
    return c_base + m * p.n;
}

fn out_col(n: u32) -> u32 {
    return n;
}

fn finish(m: u32, at: u32, v: f32) -> f32 {
    return v;
}
