//#include "common.wgsl"
// out[t, c] = table[indices[t], c]; an index past the last row is clamped to it, so a
// bad index can never read outside the table (the runtime rejects such inputs first).

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    let t = i / p.h;
    let c = i % p.h;
    let row = min(indices[t], p.vocab - 1u);
    out[i] = table[row * p.h + c];
}
