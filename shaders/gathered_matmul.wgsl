//#include "common.wgsl"
// GatheredBatchMatMul (ir/ops/linalg.py): out = transpose(G, perm) with
// G[z, m, t] = sum_k A'[z, m, k] * B'[z, k, n], n = indices[z, m, t] (n + N when negative,
// clamped to [0, N)): the elements GatherElements takes along the last axis of the product
// A' @ B', each computed alone (a K-long dot product), never the whole product. out's axes are
// G's in the order p.perm (p.odims its sizes). Batch matrix z of A starts at the element
// p.sa.z + sum_d index_d * p.a_batch[d] (p.batch the merged batch dimensions), of B at
// sum_d index_d * p.b_batch[d]; A'(m, k) is at m * p.sa.x + k * p.sa.y, B'(k, n) at
// k * p.sb.x + n * p.sb.y; the indices' element (z, m, t) at p.istr (0 along a broadcast axis).
// One output element per invocation, 256 per workgroup.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.total) {
        return;
    }
    var g = vec3<u32>();  // (z, m, t) of G
    var rest = i;
    for (var s = 0u; s < 3u; s = s + 1u) {
        let d = 2u - s;
        let size = p.odims[d];
        g[p.perm[d]] = rest % size;
        rest = rest / size;
    }
    var n = indices[g.x * p.istr.x + g.y * p.istr.y + g.z * p.istr.z];
    n = clamp(select(n, n + i32(p.n), n < 0), 0, i32(p.n) - 1);
    var a_at = p.sa.z;
    var b_at = 0u;
    var z = g.x;
    for (var d = 3; d >= 0; d = d - 1) {
        let j = z % p.batch[d];
        z = z / p.batch[d];
        a_at = a_at + j * p.a_batch[d];
        b_at = b_at + j * p.b_batch[d];
    }
    a_at = a_at + g.y * p.sa.x;
    b_at = b_at + u32(n) * p.sb.y;
    var acc = 0.0;
    for (var k = 0u; k < p.k; k = k + 1u) {
        acc = fma(a[a_at + k * p.sa.y], b[b_at + k * p.sb.x], acc);
    }
    out[i] = acc;
}
