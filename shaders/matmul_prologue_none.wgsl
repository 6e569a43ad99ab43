// matmul.wgsl hooks without a prologue: op(A) is staged as loaded, rows are not scaled.

fn stage_a(r: u32, i: u32, kk: u32) -> f32 {
    return load_a(i, kk);
}

fn finish_rows(li: u32) {}

fn row_scale(tile_row: u32) -> f32 {
    return 1.0;
}
