//#include "common.wgsl"
// ScatterAdd (ir/ops/transformer.py), the Embedding table gradient: out[v, c] = sum over t with
// indices[t] = v of src[t, c], out [V, H]. WGSL has no float atomics, so there is no
// scatter: one invocation per output element gathers instead, scanning all T indices
// (staged 256 at a time in workgroup memory, one coalesced load per workgroup) and adding
// the matching src[t, c] in increasing t, so the result is deterministic. Cost: V * H * T
// index comparisons (workgroup-memory reads) and T * ceil(V * H / 256) index loads, against
// T * H for an atomic scatter: fine for the test vocabularies, slow for a 32k vocabulary
// (a sort of the indices, or u32-atomic fixed point, would remove the V factor).
// An index >= V matches no row (the runtime rejects such inputs first).

var<workgroup> chunk: array<u32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;  // no early return: barriers below
    let v = i / p.h;
    let c = i % p.h;
    var s = 0.0;
    for (var t0 = 0u; t0 < p.t; t0 = t0 + 256u) {
        if (t0 + li < p.t) {
            chunk[li] = indices[t0 + li];
        }
        workgroupBarrier();
        let end = min(256u, p.t - t0);
        for (var k = 0u; k < end; k = k + 1u) {
            if (chunk[k] == v) {
                s = s + src[(t0 + k) * p.h + c];
            }
        }
        workgroupBarrier();
    }
    if (i < p.n) {
        out[i] = s;
    }
}
