//#include "common.wgsl"
// ToF16 of one computed input (ir/ops/half.py): out[first + i] = the float16 halves of
// x[2i] (lower) and x[2i + 1] (upper), one word per invocation, 256 per workgroup. Rows are
// contiguous and cols even, so word i of the input's rows is elements 2i, 2i + 1. Transposed
// (p.cols > 0: x is [K, cols], the output's rows its columns, row_words = K / 2 words each):
// word c of row r holds x[2c][r] and x[2c + 1][r].

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.words) {
        return;
    }
    if (p.cols == 0u) {
        out[p.first + i] = pack2x16float(vec2<f32>(x[2u * i], x[2u * i + 1u]));
    } else {
        let r = i / p.row_words;
        let c = i % p.row_words;
        out[p.first + i] = pack2x16float(vec2<f32>(x[2u * c * p.cols + r], x[(2u * c + 1u) * p.cols + r]));
    }
}
