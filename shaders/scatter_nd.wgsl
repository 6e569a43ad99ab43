//#include "common.wgsl"
// ScatterND (ir/ops/indexing.py), as a gather (WGSL has no float atomics): data and out are
// viewed as [slots, inner]; output element i starts from data[i] and applies, in row order,
// every update row whose index tuple (k_0..k_{k-1} = indices[row * k + j], k_j + dim_j when
// negative, clamped to [0, dim_j), dim_j = p.idims[j], element stride p.istr[j]) addresses
// its slot: acc = REDUCE(acc, v), v = updates[row * inner + i % inner]. That is the order
// ONNX's reference applies them in. Cost: p.rows * p.k index reads per output element.
// Template slot: REDUCE (an expression of acc and v).

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    let r = i % p.inner;
    let slot = i - r;
    var acc = data[i];
    for (var row = 0u; row < p.rows; row = row + 1u) {
        var at = 0u;
        for (var j = 0u; j < p.k; j = j + 1u) {
            let dim = i32(p.idims[j / 4u][j % 4u]);
            var kj = indices[row * p.k + j];
            kj = clamp(select(kj, kj + dim, kj < 0), 0, dim - 1);
            at = at + u32(kj) * p.istr[j / 4u][j % 4u];
        }
        if (at == slot) {
            let v = updates[row * p.inner + r];
            acc = {{REDUCE}};
        }
    }
    out[i] = acc;
}
