//#include "common.wgsl"
//#include "reduce.wgsl"
// CrossEntropyLossGrad (ir/ops/losses.py): out = (softmax(logits) * L_i - labels) / M with
// L_i = sum_j labels_ij, the max-subtracted softmax of softmax.wgsl; 0 on an all-zero label
// row. One workgroup per row of V.

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
        m = max(m, logits[base + j]);
    }
    m = workgroup_max(li, m);
    var se = 0.0;
    var ls = 0.0;
    for (var j = li; j < p.n; j = j + RED) {
        se = se + exp(logits[base + j] - m);
        ls = ls + labels[base + j];
    }
    let scale = workgroup_sum(li, ls) / workgroup_sum(li, se);
    for (var j = li; j < p.n; j = j + RED) {
        out[base + j] = (exp(logits[base + j] - m) * scale - labels[base + j]) * p.inv_rows;
    }
}
