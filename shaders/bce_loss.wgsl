//#include "common.wgsl"
//#include "reduce.wgsl"
// BceLoss and BceLossGrad (ir/ops/losses.py) on pred p and labels t of n elements, each log
// clamped below at -100 as torch.nn.BCELoss. log(0) is never relied on: clamped_log selects
// -100 for u <= 0, and a positive u too small for f32's normal range (flushed to 0 by some
// adapters) gives at most -100 as well, where the float64 reference, for a denormal u,
// gives log(u) in (-100, -87.3).
// `loss`: out[0] = -(1/n) sum t log(p) + (1 - t) log(1 - p); a single workgroup strides over
// all n elements, then reduces in a tree (no float atomics; deterministic).
// `grad`: out[i] = -(1/n) (t/p [log p > -100] - (1-t)/(1-p) [log(1-p) > -100]), elementwise.

const LOG_MIN: f32 = -100.0;

fn clamped_log(u: f32) -> f32 {
    return select(LOG_MIN, max(log(u), LOG_MIN), u > 0.0);
}

// 1/u where log(u) > -100 (u > e^-100), else 0: the derivative of clamped_log.
fn clamped_log_slope(u: f32) -> f32 {
    return select(0.0, 1.0 / u, u > 0.0 && log(u) > LOG_MIN);
}

@compute @workgroup_size(256)
fn loss(@builtin(local_invocation_index) li: u32) {
    var s = 0.0;
    for (var i = li; i < p.n; i = i + RED) {
        let x = pred[i];
        let t = labels[i];
        s = s + t * clamped_log(x) + (1.0 - t) * clamped_log(1.0 - x);
    }
    let total = workgroup_sum(li, s);
    if (li == 0u) {
        out[0] = -total * p.inv_n;
    }
}

@compute @workgroup_size(256)
fn grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    let x = pred[i];
    let t = labels[i];
    out[i] = -(t * clamped_log_slope(x) - (1.0 - t) * clamped_log_slope(1.0 - x)) * p.inv_n;
}
