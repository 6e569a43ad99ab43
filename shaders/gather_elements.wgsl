//#include "common.wgsl"
// GatherElements (ir/ops/indexing.py): out[c] = data[c with c[axis] = k], k = indices[c]
// (k + dim when negative, clamped to [0, dim)); out has shape p.dims, data element strides
// p.dstr, indices element strides p.istr (0 along the axes GatherElementsBroadcast broadcasts
// them over) (rank p.rank <= 8). One element per invocation, 256 per workgroup. INDEX computes the
// element's data offset without the gathered axis (at) and its index's (ix): a loop over the axes, or
// (ir/ops/indexing.py GATHER_ELEMENTS_UNROLLED) one statement per axis with the sizes and strides as constants.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
{{INDEX}}
    var k = indices[ix];
    k = clamp(select(k, k + p.dim, k < 0), 0, p.dim - 1);
    out[i] = data[at + u32(k) * p.dstr[p.axis / 4u][p.axis % 4u]];
}
