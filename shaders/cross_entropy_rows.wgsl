//#include "common.wgsl"
//#include "reduce.wgsl"
// CrossEntropyLoss (ir/ops/losses.py) as cross_entropy.wgsl computes it, for many short rows: each of the 256
// invocations walks its own rows (li, li + 256, ...) whole, serially, and the row terms are summed by one tree
// reduction at the end. An invocation loops ceil(M / 256) * (2 V + 1) times (cross_entropy.wgsl: M times four
// workgroup reductions), which keeps a few thousand rows of a few classes within llvmpipe's 65,535 iterations an
// invocation. Each invocation adds its rows in order, then the tree in a fixed order: deterministic.

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32) {
    var total = 0.0;
    for (var row = li; row < p.rows; row = row + RED) {
        let base = row * p.n;
        var m = MAX_INIT;
        for (var j = 0u; j < p.n; j = j + 1u) {
            m = max(m, logits[base + j]);
        }
        var se = 0.0;  // sum exp(z)
        var lz = 0.0;  // sum labels * z
        var ls = 0.0;  // sum labels
        for (var j = 0u; j < p.n; j = j + 1u) {
            let z = logits[base + j] - m;
            let l = labels[base + j];
            se = se + exp(z);
            lz = lz + l * z;
            ls = ls + l;
        }
        total = total + ls * log(se) - lz;
    }
    let all = workgroup_sum(li, total);
    if (li == 0u) {
        out[0] = all * p.inv_rows;
    }
}
