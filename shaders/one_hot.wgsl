//#include "common.wgsl"
// OneHot (ir/ops/indexing.py): out viewed as [outer, depth, inner], indices as [outer, inner];
// out[o, a, r] = values[1] where the index k = INDEX (truncated to i32; k + depth when in
// [-depth, 0)) equals a, values[0] elsewhere. One element per invocation, 256 per workgroup.
// Template slot: INDEX (indices[at] as i32).

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    let r = i % p.inner;
    let t = i / p.inner;
    let a = i32(t % u32(p.depth));
    let at = (t / u32(p.depth)) * p.inner + r;
    var k = {{INDEX}};
    k = select(k, k + p.depth, k < 0 && k >= -p.depth);
    out[i] = values[select(0u, 1u, k == a)];
}
