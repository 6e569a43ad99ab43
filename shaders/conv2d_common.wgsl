//#include "common.wgsl"
// Shared by conv2d*.wgsl (Conv2d, Conv2dGradInput, Conv2dGradWeight; ir/ops/vision.py): the
// uniform of one convolution and the flat NCHW indices of its three tensors. The input x
// is [N, cin, h, w], the kernel [cout, cin, kh, kw], the output y [N, cout, oh, ow];
// output row oy reads padded input row oy * stride + i, i < kh, that is input row
// oy * stride + i - ph when that lies in [0, h) (zero padding elsewhere).

fn x_at(nb: u32, c: u32, iy: u32, ix: u32) -> u32 {
    return ((nb * p.cin + c) * p.h + iy) * p.w + ix;
}

fn k_at(o: u32, c: u32, i: u32, j: u32) -> u32 {
    return ((o * p.cin + c) * p.kh + i) * p.kw + j;
}

fn y_at(nb: u32, o: u32, oy: u32, ox: u32) -> u32 {
    return ((nb * p.cout + o) * p.oh + oy) * p.ow + ox;
}
