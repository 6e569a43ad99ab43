//#include "conv2d_common.wgsl"
// Conv2dGradInput: dx[n,c,y,x] = sum dy[n,o,oy,ox] k[o,c,i,j] over o and the taps (i, j) with
// oy s + i = y + ph and ox s + j = x + pw for some output position (oy, ox): the transposed
// convolution, gathered per input element (no float atomics in WGSL), 256 per workgroup.
// Knowingly slow at scale for the reason conv2d.wgsl gives.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let e = linear_workgroup(wid, nwg) * 256u + li;
    if (e >= p.n) {
        return;
    }
    let ix = e % p.w;
    let iy = (e / p.w) % p.h;
    let c = (e / (p.w * p.h)) % p.cin;
    let nb = e / (p.w * p.h * p.cin);
    let py = iy + p.ph;  // coordinates in the padded input
    let px = ix + p.pw;
    var acc = 0.0;
    for (var i = 0u; i < min(p.kh, py + 1u); i = i + 1u) {
        let ty = py - i;
        let oy = ty / p.stride;
        if (ty % p.stride != 0u || oy >= p.oh) {
            continue;
        }
        for (var j = 0u; j < min(p.kw, px + 1u); j = j + 1u) {
            let tx = px - j;
            let ox = tx / p.stride;
            if (tx % p.stride != 0u || ox >= p.ow) {
                continue;
            }
            for (var o = 0u; o < p.cout; o = o + 1u) {
                acc = acc + dy[y_at(nb, o, oy, ox)] * kern[k_at(o, c, i, j)];
            }
        }
    }
    out[e] = acc;
}
