//#include "common.wgsl"
//#include "row_lanes.wgsl"
// EmbeddingSumLayerNorm (ir/ops/norms.py): row t of out is LayerNorm(x, w, bias) of
// x = table0[ids0[t]] + table1[ids1[t]] (+ table2[ids2[t]]), summed in that order, with the
// biased variance computed in a second pass over (x - mean) (Ba et al. 2016; as layer_norm.wgsl).
// An index past a table's last row is clamped to it, so a bad index can never read outside the
// table (the runtime rejects such inputs first). ROW_BASES: b0, b1, b2, the row's offsets in its
// tables; SUM: x at column j (r = row * n: where a binding x, the first tables' sum, holds the row).
//
// LANES neighbouring invocations take a row (256 / LANES rows a workgroup; ir/ops/matmul_kernel.py
// layer_norm_lanes, as the LayerNorm stage of matmul_split_layer_norm.wgsl), lane l owning columns
// l, l + LANES, ...: with VALUES > 0 (at most VALUES columns a lane) each gathers its x once and keeps
// them in registers for both passes and the output; with VALUES 0 (rows too long for that) each pass
// gathers them again. The row sums are row_lanes.wgsl's.

const VALUES: u32 = {{VALUES}}u;
const HELD: u32 = max(VALUES, 1u);  // the register array's length
const LANES: u32 = {{LANES}}u;
const ROWS: u32 = 256u / LANES;

fn x_at(j: u32, r: u32, b0: u32, b1: u32, b2: u32) -> f32 {
    return {{SUM}};
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let lane = li % LANES;
    let at = linear_workgroup(wid, nwg) * ROWS + li / LANES;
    let n = select(0u, p.n, at < p.rows);  // a row past the last reads and writes nothing, but takes part in the sums
    let row = min(at, p.rows - 1u);
{{ROW_BASES}}
    let base = row * p.n;
    var held: array<f32, HELD>;
    var s = 0.0;
    if (VALUES > 0u) {
        for (var t = 0u; t < VALUES; t = t + 1u) {
            let j = lane + t * LANES;
            var v = 0.0;
            if (j < n) {
                v = x_at(j, base, b0, b1, b2);
            }
            held[t] = v;
            s = s + v;
        }
    } else {
        for (var j = lane; j < n; j = j + LANES) {
            s = s + x_at(j, base, b0, b1, b2);
        }
    }
    let mean = row_sum(li, lane, s) / f32(p.n);
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
            let d = x_at(j, base, b0, b1, b2) - mean;
            q = q + d * d;
        }
    }
    let rstd = 1.0 / sqrt(row_sum(li, lane, q) / f32(p.n) + p.eps);
    if (VALUES > 0u) {
        for (var t = 0u; t < VALUES; t = t + 1u) {
            let j = lane + t * LANES;
            if (j < n) {
                out[base + j] = (held[t] - mean) * rstd * w[j] + bias[j];
            }
        }
    } else {
        for (var j = lane; j < n; j = j + LANES) {
            out[base + j] = (x_at(j, base, b0, b1, b2) - mean) * rstd * w[j] + bias[j];
        }
    }
}
