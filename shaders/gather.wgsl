//#include "common.wgsl"
// Gather (ir/ops/indexing.py): data viewed as [outer, dim, inner] and out as
// [outer, count, inner], out[o, q, r] = data[o, k, r] with k = indices[q], k + dim when
// negative, clamped to [0, dim). One element per invocation, 256 per workgroup. READ defines
// read_data(e), element e of data: data[e], or for data larger than one binding, element e of the
// windows data0, data1, ... (ir/kernel.py Window).

{{READ}}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    let r = i % p.inner;
    let t = i / p.inner;
    let q = t % p.count;
    let o = t / p.count;
    var k = indices[q];
    k = clamp(select(k, k + p.dim, k < 0), 0, p.dim - 1);
    out[i] = read_data((o * u32(p.dim) + u32(k)) * p.inner + r);
}
