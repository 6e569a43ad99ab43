// Index helpers of the broadcasting kernels (broadcast.wgsl, fused.wgsl), which read an operand
// through per-dimension element strides over the output's merged dimensions.

// The coordinates of row-major index t over the 4 dimensions d.
fn coords4(t: u32, d: vec4<u32>) -> vec4<u32> {
    var r = t;
    let c3 = r % d.w;
    r = r / d.w;
    let c2 = r % d.z;
    r = r / d.z;
    let c1 = r % d.y;
    return vec4<u32>(r / d.y, c1, c2, c3);
}
