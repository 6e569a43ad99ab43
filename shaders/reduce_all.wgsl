//#include "common.wgsl"
//#include "reduce.wgsl"
// SumAll and MeanAll: out[0] = scale * sum(x), scale 1 or 1/n. A single workgroup
// strides over all n elements (no float atomics in WGSL), then reduces in a tree.

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32) {
    var s = 0.0;
    for (var i = li; i < p.n; i = i + RED) {
        s = s + x[i];
    }
    let total = workgroup_sum(li, s);
    if (li == 0u) {
        out[0] = total * p.scale;
    }
}
