//#include "max_pool_common.wgsl"
// MaxPool2dGrad: dx[plane, y, x] = the sum of dy over the windows whose winning tap
// (max_pool_common.wgsl) is (y, x). Gathered per input element (no float atomics): it
// visits the ceil(kh / stride) x ceil(kw / stride) windows that contain it and rescans each,
// so an input costs up to (kh kw)^2 / stride^2 loads. 256 elements per workgroup.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let e = linear_workgroup(wid, nwg) * 256u + li;
    if (e >= p.n) {
        return;
    }
    let plane = e / (p.w * p.h);
    let py = (e / p.w) % p.h + p.pad;  // coordinates in the padded input
    let px = e % p.w + p.pad;
    // Windows oy with oy * stride <= py < oy * stride + kh.
    let oy0 = select(0u, (py + 1u - p.kh + p.stride - 1u) / p.stride, py + 1u >= p.kh);
    let ox0 = select(0u, (px + 1u - p.kw + p.stride - 1u) / p.stride, px + 1u >= p.kw);
    let oy1 = min(py / p.stride + 1u, p.oh);
    let ox1 = min(px / p.stride + 1u, p.ow);
    var acc = 0.0;
    for (var oy = oy0; oy < oy1; oy = oy + 1u) {
        for (var ox = ox0; ox < ox1; ox = ox + 1u) {
            let m = window_max(plane, oy, ox);
            if (m.found && m.at == e) {
                acc = acc + dy[(plane * p.oh + oy) * p.ow + ox];
            }
        }
    }
    out[e] = acc;
}
