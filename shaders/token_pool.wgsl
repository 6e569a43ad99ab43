//#include "common.wgsl"
//#include "reduce.wgsl"
//#include "arith.wgsl"
//#include "token_pool_rows.wgsl"
// TokenPool (ir/ops/token_pool.py): out[b] = sum_t w[b, t] x[b, t] / c_b, c_b = max(sum_t w[b, t],
// p.min_count) when MEAN else 1, then out[b] / max(|out[b]|, p.min_norm) when NORMALIZE. x is
// [batch, s, cols] units (VEC: vec4<f32> where the row holds quads, else f32), w [batch, s] (read by
// WEIGHT: f32 or i32), out [batch, cols] units. One workgroup per sentence b: its 256 invocations are
// p.groups row groups of p.unit_lanes lanes; lane u of group g sums rows g, g + groups, ... of unit
// u0 + u for each chunk of units u0 (STEP rows a step, their loads before their sums), the groups'
// sums meet in workgroup memory, and group 0 stores them and adds their squares for the norm, which
// it applies to what it stored itself. Every w[b, t] is multiplied in, so a NaN or infinity of x
// under a zero weight gives NaN as the reference's sum does; the clamps are max_f32 (a NaN count or
// norm stays NaN, as numpy's maximum and the unfused Clip give) and divide (a subnormal clamp too).

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let b = linear_workgroup(wid, nwg);
    if (b >= p.batch) {
        return;
    }
    var count = 1.0;
    if ({{MEAN}}) {
        var c = 0.0;
        for (var t = li; t < p.s; t = t + 256u) {
            c = c + weight(b * p.s + t);
        }
        count = max_f32(workgroup_sum(li, c), p.min_count);
    }
    let g = li / p.unit_lanes;
    let u = li % p.unit_lanes;
    let rows = b * p.s;
    var sq = 0.0;
    for (var u0 = 0u; u0 < p.cols; u0 = u0 + p.unit_lanes) {
        let col = u0 + u;
        part[li] = group_sum(rows, 0u, p.s, g, col);
        workgroupBarrier();
        if (g == 0u && col < p.cols) {
            let total = groups_total(u) / count;
            out[b * p.cols + col] = total;
            sq = sq + squares(total);
        }
        workgroupBarrier();
    }
    if ({{NORMALIZE}}) {
        let norm = max_f32(sqrt(workgroup_sum(li, sq)), p.min_norm);
        if (g == 0u) {
            for (var col = u; col < p.cols; col = col + p.unit_lanes) {
                out[b * p.cols + col] = out[b * p.cols + col] / norm;
            }
        }
    }
}
