//#include "common.wgsl"
// ScatterElements (ir/ops/indexing.py), as a gather (WGSL has no float atomics): output
// element c (data's shape p.ddims, rank p.rank <= 8) starts from data[c] and applies, in
// increasing u, every update updates[c with c[axis] = u] (u < p.along; indices and updates
// have shape p.udims, strides p.ustr) whose index k (k + dim when negative, clamped to
// [0, dim)) equals c[axis]: acc = REDUCE(acc, v). That is the row-major order ONNX's
// reference applies the updates in. Cost: p.along index reads per output element.
// Template slot: REDUCE (an expression of acc and v).

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    var t = i;
    var base = 0u;
    var ca = 0u;
    var inside = true;
    for (var s = 0u; s < p.rank; s = s + 1u) {
        let d = p.rank - 1u - s;
        let size = p.ddims[d / 4u][d % 4u];
        let c = t % size;
        t = t / size;
        if (d == p.axis) {
            ca = c;
        } else {
            inside = inside && c < p.udims[d / 4u][d % 4u];
            base = base + c * p.ustr[d / 4u][d % 4u];
        }
    }
    let dim = i32(p.ddims[p.axis / 4u][p.axis % 4u]);
    let step = p.ustr[p.axis / 4u][p.axis % 4u];
    var acc = data[i];
    if (inside) {
        for (var u = 0u; u < p.along; u = u + 1u) {
            let at = base + u * step;
            var k = indices[at];
            k = clamp(select(k, k + dim, k < 0), 0, dim - 1);
            if (u32(k) == ca) {
                let v = updates[at];
                acc = {{REDUCE}};
            }
        }
    }
    out[i] = acc;
}
