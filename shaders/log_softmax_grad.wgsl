//#include "common.wgsl"
//#include "reduce.wgsl"
// LogSoftmaxGrad (ir.ops_extra): dx = dy - exp(y) * sum_j dy_j over the last axis, y the
// LogSoftmax output (so exp(y) is the softmax). One workgroup per row of N.

struct Params {
    rows: u32,
    n: u32,  // row length
}

@group(0) @binding(0) var<storage, read> dy: array<f32>;
@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

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
        s = s + dy[base + j];
    }
    let total = workgroup_sum(li, s);
    for (var j = li; j < p.n; j = j + RED) {
        out[base + j] = dy[base + j] - exp(y[base + j]) * total;
    }
}
