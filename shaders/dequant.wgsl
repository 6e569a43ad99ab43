//#include "common.wgsl"
// out[r, c] = Dequant(q)[r, c] (ir/ops/quant.py): one invocation per quad of a row.

{{DECODE}}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.quads) {
        return;
    }
    let row = i / (p.cols / 4u);
    let c = i % (p.cols / 4u) * 4u;
    let v = dequant_quad_{{FORMAT}}(row, c);
    let at = row * p.cols + c;
    out[at] = v.x;
    out[at + 1u] = v.y;
    out[at + 2u] = v.z;
    out[at + 3u] = v.w;
}
