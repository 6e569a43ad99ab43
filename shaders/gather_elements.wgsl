//#include "common.wgsl"
// GatherElements (ir/ops/indexing.py): out[c] = data[c with c[axis] = k], k = indices[c]
// (k + dim when negative, clamped to [0, dim)); out has shape p.dims, data element strides
// p.dstr, indices element strides p.istr (0 along the axes GatherElementsBroadcast broadcasts
// them over) (rank p.rank <= 8). One element per invocation, 256 per workgroup.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    var t = i;
    var at = 0u;
    var ix = 0u;
    for (var s = 0u; s < p.rank; s = s + 1u) {
        let d = p.rank - 1u - s;
        let size = p.dims[d / 4u][d % 4u];
        let c = t % size;
        if (d != p.axis) {
            at = at + c * p.dstr[d / 4u][d % 4u];
        }
        ix = ix + c * p.istr[d / 4u][d % 4u];
        t = t / size;
    }
    var k = indices[ix];
    k = clamp(select(k, k + p.dim, k < 0), 0, p.dim - 1);
    out[i] = data[at + u32(k) * p.dstr[p.axis / 4u][p.axis % 4u]];
}
