// matmul_gemv.wgsl hooks for FusedRmsNormMatMul (see matmul_prologue_rms_norm.wgsl for the
// formula): x[i, k..k+3] is used as x * w_norm, and row i of C is scaled by
// 1 / sqrt(mean_k x[i, k]^2 + eps). The lanes of one column see only part of K, so
// prepare_rows first computes the scales of all ROWS rows with the whole workgroup: each
// invocation sums x^2 over every 256th quad, and workgroup_sum4 adds them up.
// x is a few rows, read again from cache by the main loop.

var<workgroup> row_rstd: vec4<f32>;  // 1 / rms of rows 0..ROWS-1

fn w_norm_at(k: u32) -> f32 {
    return w_norm[min(k, p.k - 1u)];  // past K, x is 0 and the weight does not matter
}

fn stage_x(v: vec4<f32>, k: u32) -> vec4<f32> {
    return v * vec4<f32>(w_norm_at(k), w_norm_at(k + 1u), w_norm_at(k + 2u), w_norm_at(k + 3u));
}

fn prepare_rows(li: u32) {
    var ss = vec4<f32>();
    for (var k = li * 4u; k < p.k; k = k + 1024u) {
        for (var i = 0u; i < ROWS; i = i + 1u) {
            let x = quad_a(i, k);
            ss[i] = ss[i] + dot(x, x);
        }
    }
    let total = workgroup_sum4(li, ss);
    if (li == 0u) {
        row_rstd = 1.0 / sqrt(total / f32(p.k) + p.eps);
    }
    workgroupBarrier();
}

fn row_scale(i: u32) -> f32 {
    return row_rstd[i];
}
