//#include "common.wgsl"
// The first two tables' rows of EmbeddingSumLayerNorm summed (ir/ops/norms.py, where a device binds too
// few storage buffers for embedding_layer_norm.wgsl over three tables): out[row, j] =
// table0[ids0[row], j] + table1[ids1[row], j], one element an invocation; an index past a table's last
// row is clamped to it (the runtime rejects such inputs first).

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.rows * p.n) {
        return;
    }
    let row = i / p.n;
    let j = i % p.n;
{{ROW_BASES}}
    out[i] = {{SUM}};
}
