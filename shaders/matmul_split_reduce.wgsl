//#include "common.wgsl"
//#include "arith.wgsl"
//#include "derivatives.wgsl"
// (arith and derivatives: the helpers of generated epilogue regions, ir/ops/fused_epilogue.py)
// The second dispatch of a two-stage matmul (ir/ops/matmul_kernel.py): the first (matmul.wgsl
// with SPLITS > 1) left SPLITS partial sums of C [M,N] in part; with SPLITS 1 (a product with
// a final step, ir/ops/matmul_rows.py) it left the product itself, rows already scaled.
// C[i, j] = epilogue(row_scale(i) * sum_s part[(s * M + i) * N + j]). With ROW_SUMS
// (FusedRmsNormMatMul split) row_scale(i) = 1 / sqrt(sum_s part[SPLITS * M * N + s * M + i] / K
// + eps), the inverse rms of row i of x from the splits' sums of x^2 (Zhang & Sennrich 2019);
// else 1. EPILOGUE is the product's epilogue chain, reading the operands e0, e1, ... as the
// tiled kernel does. One output element per invocation: C[i, j], or with GATED (SwiGLUConcat
// of C, Shazeer 2020) out[i, j] = silu(C[i, j]) * C[i, j + N / 2] of the [M, N / 2] output.

const SPLITS: u32 = {{SPLITS}}u;
const ROW_SUMS: bool = {{ROW_SUMS}};
const GATED: bool = {{GATED}};

fn epilogue(i: u32, j: u32, acc: f32) -> f32 {
    var v = acc;
{{EPILOGUE}}
    return v;
}

fn row_scale(i: u32) -> f32 {
    if (!ROW_SUMS) {
        return 1.0;
    }
    var ss = 0.0;
    for (var s = 0u; s < SPLITS; s = s + 1u) {
        ss = ss + part[SPLITS * p.m * p.n + s * p.m + i];
    }
    return 1.0 / sqrt(ss / f32(p.k) + p.eps);
}

// C[i, j]: the partial sums added, the row scaled, the epilogue applied.
fn value(i: u32, j: u32, scale: f32) -> f32 {
    let at = i * p.n + j;
    var v = 0.0;
    for (var s = 0u; s < SPLITS; s = s + 1u) {
        v = v + part[s * p.m * p.n + at];
    }
    return epilogue(i, j, v * scale);
}

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let at = linear_workgroup(wid, nwg) * 256u + li;
    let width = select(p.n, p.n / 2u, GATED);  // of the output
    if (at >= p.m * width) {
        return;
    }
    let i = at / width;
    let j = at % width;
    let scale = row_scale(i);
    if (GATED) {
        out[at] = silu(value(i, j, scale)) * value(i, j + width, scale);
    } else {
        out[at] = value(i, j, scale);
    }
}
