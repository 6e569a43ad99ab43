// Reductions over all `size` invocations of a workgroup with subgroup operations (WGSL
// subgroupAdd / subgroupMax), used instead of trees in workgroup memory where lowering was
// told the device has them (lowering.wgsl.subgroups). Each subgroup reduces in registers,
// one invocation per subgroup writes its result, and every invocation adds the
// size / subgroup-size partials in index order, so the result is the same in every
// invocation and from run to run.
//
// Assumes what runtime.device.subgroup_reductions_usable checks on the device before
// lowering uses this file: subgroups are full, of one power-of-two size n >= 4 that
// divides `size`, and subgroup k holds local invocations k*n .. k*n + n - 1. Call from
// uniform control flow only (subgroup operations and barriers); `size` <= 256.

var<workgroup> sg_red: array<f32, 64>;

fn sg_workgroup_sum(li: u32, v: f32, size: u32) -> f32 {
    let n = subgroupAdd(1u);  // the subgroup size: every invocation is active here
    let s = subgroupAdd(v);
    if (li % n == 0u && li / n < 64u) {  // < 64: always, with n >= 4 (kept for kernels without runtime checks)
        sg_red[li / n] = s;
    }
    workgroupBarrier();
    var t = 0.0;
    for (var i = 0u; i < size / n; i = i + 1u) {
        t = t + sg_red[i];
    }
    workgroupBarrier();  // every partial is read before sg_red is written again
    return t;
}

fn sg_workgroup_max(li: u32, v: f32, size: u32) -> f32 {
    let n = subgroupAdd(1u);
    let s = subgroupMax(v);
    if (li % n == 0u && li / n < 64u) {  // < 64: always, with n >= 4 (kept for kernels without runtime checks)
        sg_red[li / n] = s;
    }
    workgroupBarrier();
    var t = sg_red[0];
    for (var i = 1u; i < size / n; i = i + 1u) {
        t = max(t, sg_red[i]);
    }
    workgroupBarrier();
    return t;
}
