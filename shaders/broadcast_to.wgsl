//#include "common.wgsl"
// BroadcastTo (ir/ops/reductions.py): out = numpy broadcast_to(x, shape). The output is viewed
// as rank 4 (dims, after the lowering merged dimensions) and x is addressed through
// per-dimension element strides, 0 on broadcast dimensions (as broadcast.wgsl). 256 elements
// per workgroup.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    var t = i;
    let c3 = t % p.dims.w;
    t = t / p.dims.w;
    let c2 = t % p.dims.z;
    t = t / p.dims.z;
    let c1 = t % p.dims.y;
    let c0 = t / p.dims.y;
    out[i] = x[dot(vec4<u32>(c0, c1, c2, c3), p.sx)];
}
