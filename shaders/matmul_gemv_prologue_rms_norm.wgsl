// matmul_gemv.wgsl hooks for FusedRmsNormMatMul (see matmul_prologue_rms_norm.wgsl for the
// formula): x[i, k..k+3] is used as x * w_norm, and row i of C is scaled by
// 1 / sqrt(mean_k x[i, k]^2 + eps). The lanes of one column split K between them, each
// quad of a row to one lane, so each lane sums x^2 over the quads it loads for the product
// (row_stat) and the column's lane sum adds those with the dot products: the scale costs no
// pass over x and no barrier of its own. (A pass of the whole workgroup over x, then a tree
// in workgroup memory, took SmolLM2's Q4_1 decode step from 1.31 to 1.43 ms on the H200.)
// w_norm_quad (matmul_gemv.wgsl's W_NORM) reads weights k..k+3 of w_norm: one vec4 load where
// K % 4 == 0 (four scalar loads took 12 of the 39 us of SmolLM2's Q8_0 LM head on the H200).

const ROW_STAT: bool = true;

fn stage_x(v: vec4<f32>, k: u32) -> vec4<f32> {
    return v * w_norm_quad(k);
}

fn row_stat(v: vec4<f32>) -> f32 {
    return dot(v, v);
}

fn row_scale(stat: f32) -> f32 {
    return 1.0 / sqrt(stat / f32(p.k) + p.eps);
}
