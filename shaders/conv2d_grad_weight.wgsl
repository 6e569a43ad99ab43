//#include "conv2d_common.wgsl"
//#include "reduce.wgsl"
// Conv2dGradWeight: dk[o,c,i,j] = sum_{n,oy,ox} dy[n,o,oy,ox] x[n,c,oy s - ph + i, ox s - pw + j]
// over the positions whose tap lies inside the input. One workgroup per weight element: its
// 256 invocations stride over the batch * oh * ow positions, then reduce in a tree (a sum
// per output element, no float atomics), in a fixed order, so the result is deterministic.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let e = linear_workgroup(wid, nwg);
    if (e >= p.n) {
        return;
    }
    let j = e % p.kw;
    let i = (e / p.kw) % p.kh;
    let c = (e / (p.kw * p.kh)) % p.cin;
    let o = e / (p.kw * p.kh * p.cin);
    let positions = p.batch * p.oh * p.ow;
    var s = 0.0;
    for (var r = li; r < positions; r = r + RED) {
        let ox = r % p.ow;
        let oy = (r / p.ow) % p.oh;
        let nb = r / (p.ow * p.oh);
        let py = oy * p.stride + i;
        let px = ox * p.stride + j;
        if (py >= p.ph && py - p.ph < p.h && px >= p.pw && px - p.pw < p.w) {
            s = s + dy[y_at(nb, o, oy, ox)] * x[x_at(nb, c, py - p.ph, px - p.pw)];
        }
    }
    let total = workgroup_sum(li, s);
    if (li == 0u) {
        out[e] = total;
    }
}
