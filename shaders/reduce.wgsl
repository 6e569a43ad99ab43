// Workgroup-wide reductions over RED invocations (tree in workgroup memory). Call from
// uniform control flow only: they contain barriers. The result is valid in every invocation.
const RED: u32 = 256u;
var<workgroup> red: array<f32, 256>;

fn workgroup_sum(li: u32, v: f32) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var s = RED / 2u; s > 0u; s = s / 2u) {
        if (li < s) {
            red[li] = red[li] + red[li + s];
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}

fn workgroup_max(li: u32, v: f32) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var s = RED / 2u; s > 0u; s = s / 2u) {
        if (li < s) {
            red[li] = max(red[li], red[li + s]);
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}
