//#include "common.wgsl"
//#include "arith.wgsl"
//#include "derivatives.wgsl"
//#include "row_lanes.wgsl"
// (arith and derivatives: the helpers of generated epilogue regions, ir/ops/fused_epilogue.py)
// LayerNorm of each of p.m rows of C, C[i, j] = value(i, j):
// out[i, j] = (C[i, j] - mean_i) / sqrt(var_i + eps) * gamma[j] + beta[j], the biased variance
// computed in a second pass over C - mean (Ba et al. 2016; as layer_norm.wgsl); with CENTRED false
// RmsNorm, out[i, j] = C[i, j] / sqrt(mean_i(C^2) + eps) * gamma[j] (Zhang & Sennrich 2019; as
// rms_norm.wgsl): no mean, SHIFT 0 (SHIFT: beta[j] or 0.0, with no beta bound). VALUE defines value:
// - the second dispatch of FusedMatMulLayerNorm (ir/ops/matmul_rows.py; ir/ops/matmul_kernel.py
//   _PARTIAL_SUMS): C = epilogue(sum_s part[s]), the product the first dispatch left in part (SPLITS
//   partial sums from matmul.wgsl with SPLITS > 1, or with SPLITS 1 the product itself); EPILOGUE is the
//   product's chain, reading the operands e0, e1, ... as the tiled kernel does;
// - EmbeddingSumLayerNorm (ir/ops/norms.py): C = the sum of the rows its tables' indices name.
//
// LANES neighbouring invocations take a row (256 / LANES rows a workgroup), lane l owning its
// columns l, l + LANES, ...: with VALUES > 0 (at most VALUES columns a lane) each computes its
// C[i, j] once and keeps them in registers for both passes and the output; with VALUES 0 (rows
// too long for that) each pass computes them again. The row sums are
// row_lanes.wgsl's (in registers where a row's lanes lie in one subgroup).

const SPLITS: u32 = {{SPLITS}}u;
const CENTRED: bool = {{CENTRED}};
const VALUES: u32 = {{VALUES}}u;
const HELD: u32 = max(VALUES, 1u);  // the register array's length
const LANES: u32 = {{LANES}}u;
const ROWS: u32 = 256u / LANES;

fn epilogue(i: u32, j: u32, acc: f32) -> f32 {
    var v = acc;
{{EPILOGUE}}
    return v;
}

{{VALUE}}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let lane = li % LANES;
    let i = linear_workgroup(wid, nwg) * ROWS + li / LANES;
    let n = select(0u, p.n, i < p.m);  // a row past M reads and writes nothing, but takes part in the sums
    var held: array<f32, HELD>;
    var s = 0.0;
    if (VALUES > 0u) {
        for (var t = 0u; t < VALUES; t = t + 1u) {
            let j = lane + t * LANES;
            var v = 0.0;
            if (j < n) {
                v = value(i, j);
            }
            held[t] = v;
            s = s + v;
        }
    } else if (CENTRED) {  // only the mean needs this pass
        for (var j = lane; j < n; j = j + LANES) {
            s = s + value(i, j);
        }
    }
    var mean = 0.0;
    if (CENTRED) {  // a constant: uniform control flow for row_sum's barriers
        mean = row_sum(li, lane, s) / f32(p.n);
    }
    var q = 0.0;
    if (VALUES > 0u) {
        for (var t = 0u; t < VALUES; t = t + 1u) {
            if (lane + t * LANES < n) {
                let d = held[t] - mean;
                q = q + d * d;
            }
        }
    } else {
        for (var j = lane; j < n; j = j + LANES) {
            let d = value(i, j) - mean;
            q = q + d * d;
        }
    }
    let rstd = 1.0 / sqrt(row_sum(li, lane, q) / f32(p.n) + p.eps);
    if (VALUES > 0u) {
        for (var t = 0u; t < VALUES; t = t + 1u) {
            let j = lane + t * LANES;
            if (j < n) {
                out[i * p.n + j] = (held[t] - mean) * rstd * gamma[j] + {{SHIFT}};
            }
        }
    } else {
        for (var j = lane; j < n; j = j + LANES) {
            out[i * p.n + j] = (value(i, j) - mean) * rstd * gamma[j] + {{SHIFT}};
        }
    }
}
