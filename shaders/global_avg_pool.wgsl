//#include "common.wgsl"
//#include "reduce.wgsl"
// GlobalAvgPool and GlobalAvgPoolGrad (ir/ops/vision.py). x is [rows = N * C, spatial].
// `pool`: out[r] = mean of row r, one workgroup per row (256 invocations stride over it, then
// a tree reduction). `grad`: dx[r, s] = dy[r] / spatial, one invocation per element.

@compute @workgroup_size(256)
fn pool(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = linear_workgroup(wid, nwg);
    if (row >= p.rows) {
        return;
    }
    var s = 0.0;
    for (var i = li; i < p.spatial; i = i + RED) {
        s = s + x[row * p.spatial + i];
    }
    let total = workgroup_sum(li, s);
    if (li == 0u) {
        out[row] = total * p.inv;
    }
}

@compute @workgroup_size(256)
fn grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let e = linear_workgroup(wid, nwg) * 256u + li;
    if (e >= p.n) {
        return;
    }
    out[e] = x[e / p.spatial] * p.inv;
}
