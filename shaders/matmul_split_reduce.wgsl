//#include "common.wgsl"
//#include "arith.wgsl"
//#include "derivatives.wgsl"
// (arith and derivatives: the helpers of generated epilogue regions, ir/ops/fused_epilogue.py)
// The second dispatch of a split-K matmul (matmul.wgsl with SPLITS > 1, ir/ops/matmul_kernel.py):
// C[i, j] = epilogue(row_scale(i) * sum_s part[(s * M + i) * N + j]), one element per
// invocation. With ROW_SUMS (FusedRmsNormMatMul) row_scale(i) = 1 / sqrt(sum_s
// part[SPLITS * M * N + s * M + i] / K + eps), the inverse rms of row i of x from the splits'
// sums of x^2 (Zhang & Sennrich 2019); else 1. EPILOGUE is the product's epilogue chain,
// reading the operands e0, e1, ... as the tiled kernel does.

const SPLITS: u32 = {{SPLITS}}u;
const ROW_SUMS: bool = {{ROW_SUMS}};

fn epilogue(i: u32, j: u32, acc: f32) -> f32 {
    var v = acc;
{{EPILOGUE}}
    return v;
}

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let at = linear_workgroup(wid, nwg) * 256u + li;
    let mn = p.m * p.n;
    if (at >= mn) {
        return;
    }
    let i = at / p.n;
    let j = at % p.n;
    var v = 0.0;
    for (var s = 0u; s < SPLITS; s = s + 1u) {
        v = v + part[s * mn + at];
    }
    if (ROW_SUMS) {
        var ss = 0.0;
        for (var s = 0u; s < SPLITS; s = s + 1u) {
            ss = ss + part[SPLITS * mn + s * p.m + i];
        }
        v = v * (1.0 / sqrt(ss / f32(p.k) + p.eps));
    }
    out[at] = epilogue(i, j, v);
}
