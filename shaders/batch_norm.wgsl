//#include "common.wgsl"
// BatchNormalization in inference mode (ir/ops/axis_norms.py): element i of x [N, C, ...]
// is in channel c = (i / inner) % channels, inner the product of the dimensions after C;
// out = (x - mean[c]) / sqrt(var[c] + eps) * scale[c] + bias[c]. 256 elements per workgroup.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    let c = (i / p.inner) % p.channels;
    out[i] = (x[i] - input_mean[c]) / sqrt(input_var[c] + p.eps) * scale[c] + bias[c];
}
