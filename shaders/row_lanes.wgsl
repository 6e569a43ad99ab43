// Sums over the LANES neighbouring invocations that share a row (rows of LANES lanes, LANES a
// power of two dividing 256), as a tree in workgroup memory. Uniform control flow only (barriers).
// Devices with usable subgroups get row_lanes_subgroup.wgsl instead (lowering.wgsl.SUBGROUP_FORMS).
var<workgroup> row_red: array<f32, 256>;

// The sum of v over the row of invocation li (lane = li % LANES), valid in every lane of the row.
fn row_sum(li: u32, lane: u32, v: f32) -> f32 {
    row_red[li] = v;
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s = s / 2u) {
        if (lane < s) {
            row_red[li] = row_red[li] + row_red[li + s];
        }
        workgroupBarrier();
    }
    let t = row_red[li - lane];
    workgroupBarrier();  // every lane has read the sum before row_red is written again
    return t;
}

var<workgroup> row_red2: array<vec2<f32>, 256>;

// row_sum of two values at once (one set of barriers).
fn row_sum2(li: u32, lane: u32, v: vec2<f32>) -> vec2<f32> {
    row_red2[li] = v;
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s = s / 2u) {
        if (lane < s) {
            row_red2[li] = row_red2[li] + row_red2[li + s];
        }
        workgroupBarrier();
    }
    let t = row_red2[li - lane];
    workgroupBarrier();
    return t;
}
