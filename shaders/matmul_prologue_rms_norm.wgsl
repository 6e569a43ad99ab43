// matmul.wgsl hooks for FusedRmsNormMatMul: C = epilogue(RmsNorm(x, w_norm) op W)
// (Zhang & Sennrich 2019; ir.ops_fused FusedRmsNormMatMul). The A tile stages
// x[i, kk] * w_norm[kk]; the store multiplies row i by 1 / sqrt(mean_k x[i, k]^2 + eps),
// which commutes with the product. The sums of squares come for free from the A-tile
// loads: invocation li stages rows li / 16 + 16 r of the tile (r < 4) at columns
// kk = li % 16 (mod 16) of every K slice, so it sums x^2 of those rows in ss[r];
// finish_rows adds the 16 partial sums of each row in workgroup memory.

@group(0) @binding(1) var<storage, read> w_norm: array<f32>;

var<private> ss: vec4<f32>;              // partial sums of x^2, rows li / 16 + 16 r
var<workgroup> row_rstd: array<f32, 64>; // 1 / rms of each tile row

fn stage_a(r: u32, i: u32, kk: u32) -> f32 {
    let v = load_a(i, kk);  // 0 outside x
    ss[r] = ss[r] + v * v;
    return v * w_norm[min(kk, p.k - 1u)];
}

// Called after the K loop's last barrier, so a_tile is free to hold the partial sums:
// a_tile[row * 16 + li % 16] for the tile row li / 16 + 16 r.
fn finish_rows(li: u32) {
    for (var r = 0u; r < 4u; r = r + 1u) {
        a_tile[li + 256u * r] = ss[r];
    }
    workgroupBarrier();
    if (li < TILE) {
        var s = 0.0;
        for (var t = 0u; t < TK; t = t + 1u) {
            s = s + a_tile[li * TK + t];
        }
        row_rstd[li] = 1.0 / sqrt(s / f32(p.k) + p.eps);
    }
    workgroupBarrier();
}

fn row_scale(tile_row: u32) -> f32 {
    return row_rstd[tile_row];
}
