//#include "common.wgsl"
// out[r, c] = Dequant(q)[{{ROW}}, c] (Dequant and QuantEmbedding, ir/ops/quant.py): one invocation
// per quad of an output row. Dequant decodes row r; QuantEmbedding decodes only the rows looked up,
// min(indices[r], vocab - 1): an index past the last row is clamped to it, as in embedding.wgsl
// (the runtime rejects such inputs first).

{{DECODE}}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.quads) {
        return;
    }
    let r = i / (p.cols / 4u);
    let c = i % (p.cols / 4u) * 4u;
    let v = dequant_quad_{{FORMAT}}({{ROW}}, c);
    let at = r * p.cols + c;
    out[at] = v.x;
    out[at + 1u] = v.y;
    out[at + 2u] = v.z;
    out[at + 3u] = v.w;
}
