//#include "max_pool_common.wgsl"
// MaxPool2d: out[plane, oy, ox] = the largest input in the window (max_pool_common.wgsl); a
// window lying wholly in the padding writes MASK_SENTINEL (no infinities in WGSL), as the
// reference does. One invocation per output element, 256 per workgroup.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let e = linear_workgroup(wid, nwg) * 256u + li;
    if (e >= p.n) {
        return;
    }
    let ox = e % p.ow;
    let oy = (e / p.ow) % p.oh;
    let m = window_max(e / (p.ow * p.oh), oy, ox);
    out[e] = select(MASK_SENTINEL, m.best, m.found);
}
