//#include "common.wgsl"
//#include "reduce.wgsl"
//#include "axes_common.wgsl"
// SoftmaxAxis, LogSoftmaxAxis, LpNormalization and MeanVarianceNormalization
// (ir/ops/axis_norms.py): each group of elements (those that differ only along the reduced
// axes) is normalised by statistics of its own. Group o holds
// x[at(o, keep_dims, keep_st) + at(r, red_dims, red_st)] for r < red_len (axes_common.wgsl).
// Passes: the centre c (CENTRE 0: none, 1: the maximum, so exp(v - c) never overflows,
// 2: the mean, taken about the group's first element x0, so that a group of equal values has exactly
// that mean and MVN's (v - c) is 0, not float32's rounding over a std of about as little), then s = sum of TERM(v, c), then every element becomes OUT(v, c, s).
// Entry points: `per_group`, a workgroup per group (trees of reduce.wgsl), and
// `per_element`, an invocation per group (short groups, or many whose innermost axis is kept).

// the offset of group o and of its r-th reduced element (lowering's KEEP_AT / RED_AT: a single
// merged dimension is one multiply, more go through at())
fn keep_at(o: u32) -> u32 {
    return {{KEEP_AT}};
}

fn red_at(r: u32) -> u32 {
    return {{RED_AT}};
}

const CENTRE: u32 = {{CENTRE}}u;

fn term(v: f32, c: f32) -> f32 {
    return {{TERM}};
}

fn value(v: f32, c: f32, s: f32) -> f32 {
    return {{OUT}};
}

@compute @workgroup_size(256)
fn per_element(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) li: u32) {
    let o = linear_workgroup(wid, nwg) * 256u + li;
    if (o >= p.n) {
        return;
    }
    let base = keep_at(o);
    var c = 0.0;
    if (CENTRE == 1u) {
        c = x[base];
        for (var r = 1u; r < p.red_len; r = r + 1u) {
            c = max(c, x[base + red_at(r)]);
        }
    } else if (CENTRE == 2u) {  // the mean as x0 + mean(x - x0): exactly x0 on a line of equal values
        let x0 = x[base];
        for (var r = 1u; r < p.red_len; r = r + 1u) {
            c = c + (x[base + red_at(r)] - x0);
        }
        c = x0 + c / f32(p.red_len);
    }
    var s = 0.0;
    for (var r = 0u; r < p.red_len; r = r + 1u) {
        s = s + term(x[base + red_at(r)], c);
    }
    for (var r = 0u; r < p.red_len; r = r + 1u) {
        let i = base + red_at(r);
        out[i] = value(x[i], c, s);
    }
}

@compute @workgroup_size(256)
fn per_group(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) li: u32) {
    let o = linear_workgroup(wid, nwg);
    if (o >= p.n) {
        return;
    }
    let base = keep_at(o);
    var c = 0.0;
    if (CENTRE == 1u) {
        var m = MAX_INIT;
        for (var r = li; r < p.red_len; r = r + RED) {
            m = max(m, x[base + red_at(r)]);
        }
        c = workgroup_max(li, m);
    } else if (CENTRE == 2u) {  // the mean as x0 + mean(x - x0): exactly x0 on a line of equal values
        let x0 = x[base];
        var t = 0.0;
        for (var r = li; r < p.red_len; r = r + RED) {
            t = t + (x[base + red_at(r)] - x0);
        }
        c = x0 + workgroup_sum(li, t) / f32(p.red_len);
    }
    var q = 0.0;
    for (var r = li; r < p.red_len; r = r + RED) {
        q = q + term(x[base + red_at(r)], c);
    }
    let s = workgroup_sum(li, q);
    for (var r = li; r < p.red_len; r = r + RED) {
        let i = base + red_at(r);
        out[i] = value(x[i], c, s);
    }
}
