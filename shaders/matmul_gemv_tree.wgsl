// The lane sums of matmul_gemv.wgsl as a tree in workgroup memory (red: 256 vec4), shared by
// matmul_gemv_reduce.wgsl and its subgroup form. Uniform control flow only.

// The sum of v over the LANES lanes of an invocation's column, valid in lane 0: a tree of
// log2(LANES) steps; neighbouring lanes are `stride` invocations apart.
fn lanes_tree(li: u32, lane: u32, stride: u32, v: vec4<f32>) -> vec4<f32> {
    red[li] = v;
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s = s / 2u) {
        if (lane < s) {
            red[li] = red[li] + red[li + s * stride];
        }
        workgroupBarrier();
    }
    return red[li];  // the next write of red[li] is this invocation's own
}
