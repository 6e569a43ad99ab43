//#include "common.wgsl"
//#include "reduce.wgsl"
// SoftmaxGrad (ir/ops/norms.py): dx = y * (dy - sum_j dy_j y_j), y the Softmax output, and
// LogSoftmaxGrad: dx = dy - exp(y) * sum_j dy_j, y the LogSoftmax output (so
// exp(y) is the softmax); over the last axis, one workgroup per row of N.
// Template slots: TERM, the summand of element i (dy[i] * y[i], or dy[i]); GRAD, element i
// of dx from the row's sum `total`.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = linear_workgroup(wid, nwg);
    if (row >= p.rows) {
        return;
    }
    let base = row * p.n;
    var s = 0.0;
    for (var j = li; j < p.n; j = j + RED) {
        let i = base + j;
        s = s + {{TERM}};
    }
    let total = workgroup_sum(li, s);
    for (var j = li; j < p.n; j = j + RED) {
        let i = base + j;
        out[i] = {{GRAD}};
    }
}
