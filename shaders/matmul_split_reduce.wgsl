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
// With QUADS (N and the output's width multiples of 4) one quad of an output row per invocation, part
// and out bound as vec4<f32>, each element's sums added in the same order. ACCESS defines part1(e) and
// part4(e) (e a multiple of 4), the floats e and e..e+3 of part, and put1 and put4, their stores into out.

const SPLITS: u32 = {{SPLITS}}u;
const ROW_SUMS: bool = {{ROW_SUMS}};
const GATED: bool = {{GATED}};
const QUADS: bool = {{QUADS}};

{{ACCESS}}

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
        ss = ss + part1(SPLITS * p.m * p.n + s * p.m + i);
    }
    return 1.0 / sqrt(ss / f32(p.k) + p.eps);
}

// C[i, j]: the partial sums added, the row scaled, the epilogue applied.
fn value(i: u32, j: u32, scale: f32) -> f32 {
    let at = i * p.n + j;
    var v = 0.0;
    for (var s = 0u; s < SPLITS; s = s + 1u) {
        v = v + part1(s * p.m * p.n + at);
    }
    return epilogue(i, j, v * scale);
}

// C[i, j..j+3] (j a multiple of 4): value's sums for four columns at once.
fn value4(i: u32, j: u32, scale: f32) -> vec4<f32> {
    let at = i * p.n + j;
    var v = vec4<f32>();
    for (var s = 0u; s < SPLITS; s = s + 1u) {
        v = v + part4(s * p.m * p.n + at);
    }
    let c = v * scale;
    return vec4<f32>(epilogue(i, j, c.x), epilogue(i, j + 1u, c.y), epilogue(i, j + 2u, c.z),
                     epilogue(i, j + 3u, c.w));
}

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let at = (linear_workgroup(wid, nwg) * 256u + li) * select(1u, 4u, QUADS);  // its first output element
    let width = select(p.n, p.n / 2u, GATED);  // of the output
    if (at >= p.m * width) {
        return;
    }
    let i = at / width;
    let j = at % width;
    let scale = row_scale(i);
    if (QUADS) {
        if (GATED) {
            let g = value4(i, j, scale);
            let u = value4(i, j + width, scale);
            put4(at, vec4<f32>(silu(g.x) * u.x, silu(g.y) * u.y, silu(g.z) * u.z, silu(g.w) * u.w));
        } else {
            put4(at, value4(i, j, scale));
        }
    } else if (GATED) {
        put1(at, silu(value(i, j, scale)) * value(i, j + width, scale));
    } else {
        put1(at, value(i, j, scale));
    }
}
