//#include "common.wgsl"
// GatherND (ir/ops/indexing.py): out viewed as [batch * rows, inner]; out[t, r] =
// data[batch, k_0, .., k_{k-1}, r] with batch = t / rows and k_j = indices[t * k + j]
// (k_j + dim_j when negative, clamped to [0, dim_j), dim_j = p.idims[j], element stride
// p.istr[j]). One element per invocation, 256 per workgroup.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    let r = i % p.inner;
    let t = i / p.inner;
    var at = (t / p.rows) * p.batch_stride + r;
    for (var j = 0u; j < p.k; j = j + 1u) {
        let dim = i32(p.idims[j / 4u][j % 4u]);
        var kj = indices[t * p.k + j];
        kj = clamp(select(kj, kj + dim, kj < 0), 0, dim - 1);
        at = at + u32(kj) * p.istr[j / 4u][j % 4u];
    }
    out[i] = data[at];
}
