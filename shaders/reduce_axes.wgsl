//#include "common.wgsl"
//#include "reduce.wgsl"
//#include "axes_common.wgsl"
// ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2, ReduceLogSum,
// ReduceLogSumExp, ReduceSumSquare and InvStdDev over any set of axes (ir/ops/reduce_axes.py).
// Output element o reduces x[at(o, keep_dims, keep_st) + at(r, red_dims, red_st)] over
// r < red_len (axes_common.wgsl): acc = term(x_0) then acc = combine(acc, term(x_r)), so
// no identity element is needed, and out[o] = finish(acc). Template slots: T, the element
// type (f32, i32, or u32 for bool), and the op's TERM (of v and the centre c), COMBINE (of a
// and b) and FINISH (of a and c). CENTRE: 0 none, 1 the maximum (log-sum-exp is c + log of
// sum exp(v - c), exact for large v), 2 the mean (InvStdDev's variance is the mean of
// (v - c)^2, computed in a second pass). Accumulation is in T: f32 for floats; i32 wraps.
// Two entry points: `per_group`, a workgroup per output element striding over the
// reduction, then a tree (for long reductions), and `per_element`, an invocation per output
// element looping over it (for short ones, or many outputs whose innermost axis is kept).
// Knowingly slow at scale: a reduction to few outputs (ReduceSum of everything) runs on as many
// workgroups, as SumAll does (no float atomics in WGSL, and a dispatch has no scratch buffer).

// the offset of group o and of its r-th reduced element (lowering's KEEP_AT / RED_AT: a single
// merged dimension is one multiply, more go through at())
fn keep_at(o: u32) -> u32 {
    return {{KEEP_AT}};
}

fn red_at(r: u32) -> u32 {
    return {{RED_AT}};
}

const CENTRE: u32 = {{CENTRE}}u;

var<workgroup> part: array<{{T}}, 256>;

fn term(v: {{T}}, c: f32) -> {{T}} {
    return {{TERM}};
}

fn combine(a: {{T}}, b: {{T}}) -> {{T}} {
    return {{COMBINE}};
}

fn finish(a: {{T}}, c: f32) -> {{T}} {
    return {{FINISH}};
}

fn element(base: u32, r: u32) -> {{T}} {
    return x[base + red_at(r)];
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
        c = f32(element(base, 0u));
        for (var r = 1u; r < p.red_len; r = r + 1u) {
            c = max(c, f32(element(base, r)));
        }
    } else if (CENTRE == 2u) {
        for (var r = 0u; r < p.red_len; r = r + 1u) {
            c = c + f32(element(base, r));
        }
        c = c / f32(p.red_len);
    }
    var a = term(element(base, 0u), c);
    for (var r = 1u; r < p.red_len; r = r + 1u) {
        a = combine(a, term(element(base, r), c));
    }
    out[o] = finish(a, c);
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
            m = max(m, f32(element(base, r)));
        }
        c = workgroup_max(li, m);
    } else if (CENTRE == 2u) {
        var s = 0.0;
        for (var r = li; r < p.red_len; r = r + RED) {
            s = s + f32(element(base, r));
        }
        c = workgroup_sum(li, s) / f32(p.red_len);
    }
    var a = {{T}}();
    if (li < p.red_len) {
        a = term(element(base, li), c);
        for (var r = li + 256u; r < p.red_len; r = r + 256u) {
            a = combine(a, term(element(base, r), c));
        }
    }
    // tree over the first min(red_len, 256) partials: [0, cnt) holds valid ones at each level
    part[li] = a;
    workgroupBarrier();
    var cnt = min(p.red_len, 256u);
    for (var s = 128u; s > 0u; s = s / 2u) {
        if (li < s && li + s < cnt) {
            part[li] = combine(part[li], part[li + s]);
        }
        cnt = min(cnt, s);
        workgroupBarrier();
    }
    if (li == 0u) {
        out[o] = finish(part[0], c);
    }
}
