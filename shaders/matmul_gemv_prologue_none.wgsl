// matmul_gemv.wgsl hooks without a prologue: rows of op(A) are used as loaded, not scaled.

fn stage_x(v: vec4<f32>, k: u32) -> vec4<f32> {
    return v;
}

fn prepare_rows(li: u32) {}

fn row_scale(i: u32) -> f32 {
    return 1.0;
}
