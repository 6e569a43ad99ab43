//#include "conv2d_common.wgsl"
// Conv2d: y[n,o,oy,ox] = sum_{c,i,j} x[n,c,oy s - ph + i, ox s - pw + j] k[o,c,i,j] over the
// taps inside the input. Direct convolution, one invocation per output element, 256 per
// workgroup. Knowingly slow at scale: each output reads its cin * kh * kw inputs and weights
// from global memory with no reuse through workgroup memory (the seed runs an implicit GEMM
// in 32 or 64 tiles); fine for the small convolutions of tests and heads.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let e = linear_workgroup(wid, nwg) * 256u + li;
    if (e >= p.n) {
        return;
    }
    let ox = e % p.ow;
    let oy = (e / p.ow) % p.oh;
    let o = (e / (p.ow * p.oh)) % p.cout;
    let nb = e / (p.ow * p.oh * p.cout);
    var acc = 0.0;
    for (var c = 0u; c < p.cin; c = c + 1u) {
        for (var i = 0u; i < p.kh; i = i + 1u) {
            let py = oy * p.stride + i;  // row in the padded input
            if (py < p.ph || py - p.ph >= p.h) {
                continue;
            }
            for (var j = 0u; j < p.kw; j = j + 1u) {
                let px = ox * p.stride + j;
                if (px < p.pw || px - p.pw >= p.w) {
                    continue;
                }
                acc = acc + x[x_at(nb, c, py - p.ph, px - p.pw)] * kern[k_at(o, c, i, j)];
            }
        }
    }
    out[e] = acc;
}
