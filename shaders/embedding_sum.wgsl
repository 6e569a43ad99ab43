//#include "common.wgsl"
// The first two tables' rows of EmbeddingSumLayerNorm summed (ir/ops/norms.py, where a device binds too
// few storage buffers for its one-dispatch form over three tables): out[i, j] = value(i, j) =
// table0[ids0[i], j] + table1[ids1[i], j], one element an invocation; VALUE is the same function as in
// the LayerNorm dispatch (an index past a table's last row clamped to it; the runtime rejects such
// inputs first).

{{VALUE}}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let at = linear_workgroup(wid, nwg) * 256u + li;
    if (at >= p.m * p.n) {
        return;
    }
    out[at] = value(at / p.n, at % p.n);
}
