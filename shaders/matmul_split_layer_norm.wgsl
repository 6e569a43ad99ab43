//#include "common.wgsl"
//#include "arith.wgsl"
//#include "derivatives.wgsl"
//#include "row_lanes.wgsl"
// (arith and derivatives: the helpers of generated epilogue regions, ir/ops/fused_epilogue.py)
// LayerNorm of each of p.m rows of C:
// out[i, j] = (C[i, j] - mean_i) / sqrt(var_i + eps) * gamma[j] + beta[j], the biased variance
// (Ba et al. 2016; as layer_norm.wgsl). The first pass takes the mean rounded to one float, m0; the
// second sums d = C - m0 and d^2, so that mean = m0 + delta (delta = mean(d), what m0's rounding
// left: a row of a large mean and a small spread keeps its low bits), var = mean(d^2) - delta^2, and
// the output is (d - delta) * rstd; with CENTRED false
// RmsNorm, out[i, j] = C[i, j] / sqrt(mean_i(C^2) + eps) * gamma[j] (Zhang & Sennrich 2019; as
// rms_norm.wgsl): no mean, no beta. VALUE defines value4(i, j), C[i, j .. j + WIDTH - 1] in the
// first WIDTH components of a vec4 (the others 0):
// - the second dispatch of FusedMatMulLayerNorm (ir/ops/matmul_rows.py; ir/ops/matmul_kernel.py
//   _PARTIAL_SUMS, _PARTIAL_SUMS_QUADS): C = epilogue(sum_s part[s]), the product the first dispatch
//   left in part (SPLITS partial sums from matmul.wgsl with SPLITS > 1, or with SPLITS 1 the product
//   itself); EPILOGUE is the product's chain, reading the operands e0, e1, ... as the tiled kernel does;
// - EmbeddingSumLayerNorm (ir/ops/norms.py): C = the sum of the rows its tables' indices name.
// STORE defines put(i, u, y) (y: the unit's normalised values, before gamma and beta), writing unit u
// of row i through gamma (and beta): quads bound as vec4 where WIDTH is 4, else one f32; and
// put_value(i, u, v), which with PAIR writes the unit's values C themselves (FusedMatMulLayerNormPair:
// out holds C's rows, then the normalised rows; without PAIR it is never called).
//
// A row is cut into units of WIDTH columns (4 where p.n is a multiple of 4, else 1). LANES
// neighbouring invocations take a row (WG / LANES rows a workgroup of WG), lane l owning its units
// l, l + LANES, ...: with VALUES > 0 (at most VALUES units a lane) each computes its units once and
// keeps them in registers for both passes and the output; with VALUES 0 (rows too long for that)
// each pass computes them again. The row sums are row_lanes.wgsl's (in registers where a row's
// lanes lie in one subgroup).

const SPLITS: u32 = {{SPLITS}}u;
const CENTRED: bool = {{CENTRED}};
const PAIR: bool = {{PAIR}};
const VALUES: u32 = {{VALUES}}u;
const HELD: u32 = max(VALUES, 1u);  // the register array's length
const LANES: u32 = {{LANES}}u;
const ROWS: u32 = {{WG}}u / LANES;
const WIDTH: u32 = {{WIDTH}}u;
// the components of a unit that hold columns
const KEEP: vec4<f32> = {{KEEP}};

fn epilogue(i: u32, j: u32, acc: f32) -> f32 {
    var v = acc;
{{EPILOGUE}}
    return v;
}

{{VALUE}}

{{STORE}}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let lane = li % LANES;
    let i = linear_workgroup(wid, nwg) * ROWS + li / LANES;
    // a row past M reads and writes nothing, but takes part in the sums
    let units = select(0u, p.n / WIDTH, i < p.m);
    var held: array<vec4<f32>, HELD>;
    var s = vec4<f32>();
    if (VALUES > 0u) {
        for (var t = 0u; t < VALUES; t = t + 1u) {
            let u = lane + t * LANES;
            var v = vec4<f32>();
            if (u < units) {
                v = value4(i, u * WIDTH);
            }
            held[t] = v;
            s = s + v;
        }
    } else if (CENTRED) {  // only the mean needs this pass
        for (var u = lane; u < units; u = u + LANES) {
            s = s + value4(i, u * WIDTH);
        }
    }
    var mean = 0.0;  // m0
    if (CENTRED) {  // a constant: uniform control flow for row_sum's barriers
        // each lane's part divided by n before the row's sum: a row whose n values add up past f32's range
        // (n * |x| above 3.4e38) keeps a finite mean
        mean = row_sum(li, lane, (s.x + s.y + s.z + s.w) / f32(p.n));
    }
    var q = vec2<f32>();  // sums of d and d^2
    if (VALUES > 0u) {
        for (var t = 0u; t < VALUES; t = t + 1u) {
            if (lane + t * LANES < units) {
                let d = (held[t] - mean) * KEEP;  // masked before squaring: no inf * 0
                q = q + vec2<f32>(d.x + d.y + d.z + d.w, dot(d, d));
            }
        }
    } else {
        for (var u = lane; u < units; u = u + LANES) {
            let d = (value4(i, u * WIDTH) - mean) * KEEP;
            q = q + vec2<f32>(d.x + d.y + d.z + d.w, dot(d, d));
        }
    }
    var delta = 0.0;
    var variance = 0.0;
    if (CENTRED) {
        let r = row_sum2(li, lane, q) / f32(p.n);
        delta = r.x;
        variance = max(r.y - delta * delta, 0.0);
    } else {
        variance = row_sum(li, lane, q.y) / f32(p.n);
    }
    let rstd = 1.0 / sqrt(variance + p.eps);
    if (VALUES > 0u) {
        for (var t = 0u; t < VALUES; t = t + 1u) {
            let u = lane + t * LANES;
            if (u < units) {
                if (PAIR) {
                    put_value(i, u, held[t]);
                }
                put(i, u, ((held[t] - mean) - delta) * rstd);
            }
        }
    } else {
        for (var u = lane; u < units; u = u + LANES) {
            let v = value4(i, u * WIDTH);
            if (PAIR) {
                put_value(i, u, v);
            }
            put(i, u, ((v - mean) - delta) * rstd);
        }
    }
}
