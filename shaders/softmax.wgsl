//#include "common.wgsl"
//#include "reduce.wgsl"
// Softmax and LogSoftmax (ir/ops/norms.py) over the last axis: one workgroup per row of
// N, z = x - max_j x_j, so rows of large or sentinel logits stay finite; z is exact for
// nearby logits (Sterbenz), so log-softmax logits of 1e3 lose nothing.
// Template slots: NORM, of the row's total = sum_j exp(z_j) (1 / total, or log(total));
// OUT, element j from z and norm (exp(z) * norm, or z - norm).

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = linear_workgroup(wid, nwg);
    if (row >= p.rows) {
        return;
    }
    let base = row * p.n;
    var m = MAX_INIT;
    for (var j = li; j < p.n; j = j + RED) {
        m = max(m, x[base + j]);
    }
    m = workgroup_max(li, m);
    var s = 0.0;
    for (var j = li; j < p.n; j = j + RED) {
        s = s + exp(x[base + j] - m);
    }
    let total = workgroup_sum(li, s);
    let norm = {{NORM}};
    for (var j = li; j < p.n; j = j + RED) {
        let z = x[base + j] - m;
        out[base + j] = {{OUT}};
    }
}
