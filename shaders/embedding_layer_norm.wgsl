//#include "common.wgsl"
//#include "reduce.wgsl"
// EmbeddingSumLayerNorm (ir/ops/norms.py): row t of out is LayerNorm(x, w, bias) of
// x = table0[ids0[t]] + table1[ids1[t]] (+ table2[ids2[t]]), summed in that order, with the
// biased variance computed in a second pass over (x - mean) as layer_norm.wgsl does (Ba et al.
// 2016). One workgroup per row; x is gathered again in each pass (the rows stay in cache). An index
// past a table's last row is clamped to it, so a bad index can never read outside the table
// (the runtime rejects such inputs first). ROW_BASES: b0, b1, ... the rows' offsets in their
// tables; SUM: x at column j (r = row * n: where a binding x, the first tables' sum, holds the row).

fn x_at(j: u32, r: u32, b0: u32, b1: u32, b2: u32) -> f32 {
    return {{SUM}};
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = linear_workgroup(wid, nwg);
    if (row >= p.rows) {
        return;
    }
{{ROW_BASES}}
    let base = row * p.n;
    var s = 0.0;
    for (var j = li; j < p.n; j = j + RED) {
        s = s + x_at(j, base, b0, b1, b2);
    }
    let mean = workgroup_sum(li, s) / f32(p.n);
    var q = 0.0;
    for (var j = li; j < p.n; j = j + RED) {
        let d = x_at(j, base, b0, b1, b2) - mean;
        q = q + d * d;
    }
    let rstd = 1.0 / sqrt(workgroup_sum(li, q) / f32(p.n) + p.eps);
    for (var j = li; j < p.n; j = j + RED) {
        out[base + j] = (x_at(j, base, b0, b1, b2) - mean) * rstd * w[j] + bias[j];
    }
}
