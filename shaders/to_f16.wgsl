//#include "common.wgsl"
// ToF16 of one computed input (ir/ops/half.py): out[first + i] = the float16 halves of
// x[2i] (lower) and x[2i + 1] (upper), one word per invocation, 256 per workgroup. Rows are
// contiguous and cols even, so word i of the input's rows is elements 2i, 2i + 1.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.words) {
        return;
    }
    out[p.first + i] = pack2x16float(vec2<f32>(x[2u * i], x[2u * i + 1u]));
}
