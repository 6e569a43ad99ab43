//#include "common.wgsl"
// Shared by max_pool.wgsl and max_pool_grad.wgsl (MaxPool2d, MaxPool2dGrad; ir/ops/vision.py):
// the uniform and the scan of one pooling window, so the forward and the gradient agree on
// which tap wins. x is [N*C planes, h, w]; output row oy covers padded rows oy * stride + i,
// i < kh, that is input rows oy * stride + i - pad inside [0, h) (padding never wins).

// The scan of one window: whether a tap lies inside the input, the first maximum in
// row-major tap order (only a strictly larger value replaces it) and that tap's index in x.
struct WindowMax {
    found: bool,
    best: f32,
    at: u32,
}

fn window_max(plane: u32, oy: u32, ox: u32) -> WindowMax {
    var found = false;
    var best = 0.0;
    var at = 0u;
    for (var i = 0u; i < p.kh; i = i + 1u) {
        let py = oy * p.stride + i;
        if (py < p.pad || py - p.pad >= p.h) {
            continue;
        }
        for (var j = 0u; j < p.kw; j = j + 1u) {
            let px = ox * p.stride + j;
            if (px < p.pad || px - p.pad >= p.w) {
                continue;
            }
            let idx = (plane * p.h + py - p.pad) * p.w + px - p.pad;
            let v = x[idx];
            if (!found || v > best) {
                found = true;
                best = v;
                at = idx;
            }
        }
    }
    return WindowMax(found, best, at);
}
