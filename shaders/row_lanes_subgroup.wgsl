// row_lanes.wgsl's row_sum with subgroup operations (lowering.wgsl.SUBGROUP_FORMS; the device's
// subgroups are full, contiguous and of one power-of-two size n, as
// runtime.device.subgroup_reductions_usable checks). A row of LANES <= n lanes lies in one
// subgroup: a butterfly of log2(LANES) subgroupShuffleXor steps adds it in registers, with no
// workgroup memory and no barrier, and leaves the same sum in every lane (each step adds the same
// two values in either order). A longer row spans LANES / n whole subgroups: each adds its part
// (subgroupAdd), and every lane adds the row's parts from workgroup memory in index order.
// n is the same in every subgroup, so the branch is uniform at run time (naga accepts the barriers
// behind it; as for matmul_gemv_reduce_subgroup.wgsl, Tint's static analysis would not).
// Uniform control flow only.
var<workgroup> row_red: array<f32, 64>;

fn row_sum(li: u32, lane: u32, v: f32) -> f32 {
    let n = subgroupAdd(1u);  // the subgroup size: every invocation is active here
    if (LANES <= n) {
        var t = v;
        for (var s = LANES / 2u; s > 0u; s = s / 2u) {
            t = t + subgroupShuffleXor(t, s);
        }
        return t;
    }
    let s = subgroupAdd(v);
    if (li % n == 0u && li / n < 64u) {  // < 64: always, with n >= 4 (kept for kernels without runtime checks)
        row_red[li / n] = s;
    }
    workgroupBarrier();
    let first = (li - lane) / n;
    var t = 0.0;
    for (var k = 0u; k < LANES / n; k = k + 1u) {
        t = t + row_red[min(first + k, 63u)];
    }
    workgroupBarrier();  // every lane has read the parts before row_red is written again
    return t;
}

var<workgroup> row_red2: array<vec2<f32>, 64>;

// row_sum of two values at once (one set of barriers).
fn row_sum2(li: u32, lane: u32, v: vec2<f32>) -> vec2<f32> {
    let n = subgroupAdd(1u);
    if (LANES <= n) {
        var t = v;
        for (var s = LANES / 2u; s > 0u; s = s / 2u) {
            t = t + subgroupShuffleXor(t, s);
        }
        return t;
    }
    let s = subgroupAdd(v);
    if (li % n == 0u && li / n < 64u) {
        row_red2[li / n] = s;
    }
    workgroupBarrier();
    let first = (li - lane) / n;
    var t = vec2<f32>();
    for (var k = 0u; k < LANES / n; k = k + 1u) {
        t = t + row_red2[min(first + k, 63u)];
    }
    workgroupBarrier();
    return t;
}
