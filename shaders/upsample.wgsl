//#include "common.wgsl"
// Upsample2x and Upsample2xGrad (ir/ops/vision.py) on planes (N * C) of h x w low-resolution
// pixels, one invocation per output element, 256 per workgroup.
// `up`: out[plane, y, x] = x[plane, y / 2, x / 2] over the 2h x 2w output (nearest neighbour).
// `grad`: out[plane, y, x] = the sum of the 2 x 2 block of dy at (2y, 2x), dy 2h x 2w.

@compute @workgroup_size(256)
fn up(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
      @builtin(local_invocation_index) li: u32) {
    let e = linear_workgroup(wid, nwg) * 256u + li;
    if (e >= p.n) {
        return;
    }
    let ox = e % (2u * p.w);
    let oy = (e / (2u * p.w)) % (2u * p.h);
    let plane = e / (4u * p.w * p.h);
    out[e] = x[(plane * p.h + oy / 2u) * p.w + ox / 2u];
}

@compute @workgroup_size(256)
fn grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let e = linear_workgroup(wid, nwg) * 256u + li;
    if (e >= p.n) {
        return;
    }
    let ix = e % p.w;
    let iy = (e / p.w) % p.h;
    let plane = e / (p.w * p.h);
    let top = (plane * 2u * p.h + 2u * iy) * 2u * p.w + 2u * ix;  // dy[plane, 2 iy, 2 ix]
    let below = top + 2u * p.w;
    out[e] = (x[top] + x[top + 1u]) + (x[below] + x[below + 1u]);
}
