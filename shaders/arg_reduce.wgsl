//#include "common.wgsl"
//#include "axes_common.wgsl"
// ArgMax, ArgMin (ir/ops/reduce_axes.py) and Hardmax (ir/ops/axis_norms.py): the winning
// index along one axis of each line. x is viewed as [outer, n, inner]: line o of
// p.lines = outer * inner starts at (o / inner) * n * inner + o % inner, its element j is
// j * inner further. A value wins by CMP (bv > av, or bv < av); a NaN wins over any number
// and equal values (or two NaNs) by their index, the lower one unless LAST, as numpy's
// argmax / argmin (select_last_index: the higher one). STORE is the body of
// store(o, base, idx, li, step): the index (ArgMax / ArgMin), or the one-hot line (Hardmax)
// written by invocations li, li + step, ... Slots: T (f32 or i32), NAN (the NaN test of v).
// Entry points: `per_element`, an invocation per line; `per_group`, a workgroup per line
// (long axes) with a tree in workgroup memory.

const LAST: bool = {{LAST}};

var<workgroup> best_v: array<{{T}}, 256>;
var<workgroup> best_i: array<u32, 256>;

fn nan_of(v: {{T}}) -> bool {
    return {{NAN}};
}

// whether (bv, bi) wins over (av, ai)
fn beats(bv: {{T}}, bi: u32, av: {{T}}, ai: u32) -> bool {
    let bn = nan_of(bv);
    let an = nan_of(av);
    if (bn != an) {
        return bn;
    }
    if (bn || bv == av) {
        return select((bi < ai), (bi > ai), LAST);
    }
    return {{CMP}};
}

fn store(o: u32, base: u32, idx: u32, li: u32, step: u32) {
    {{STORE}}
}

fn line_base(o: u32) -> u32 {
    return (o / p.inner) * p.n * p.inner + o % p.inner;
}

@compute @workgroup_size(256)
fn per_element(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) li: u32) {
    let o = linear_workgroup(wid, nwg) * 256u + li;
    if (o >= p.lines) {
        return;
    }
    let base = line_base(o);
    var bv = x[base];
    var bi = 0u;
    for (var j = 1u; j < p.n; j = j + 1u) {
        let v = x[base + j * p.inner];
        if (beats(v, j, bv, bi)) {
            bv = v;
            bi = j;
        }
    }
    store(o, base, bi, 0u, 1u);
}

@compute @workgroup_size(256)
fn per_group(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) li: u32) {
    let o = linear_workgroup(wid, nwg);
    if (o >= p.lines) {
        return;
    }
    let base = line_base(o);
    // every invocation starts from element 0, a member of the line, so all 256 partials are valid
    var bv = x[base];
    var bi = 0u;
    for (var j = li; j < p.n; j = j + 256u) {
        let v = x[base + j * p.inner];
        if (beats(v, j, bv, bi)) {
            bv = v;
            bi = j;
        }
    }
    best_v[li] = bv;
    best_i[li] = bi;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s / 2u) {
        if (li < s && beats(best_v[li + s], best_i[li + s], best_v[li], best_i[li])) {
            best_v[li] = best_v[li + s];
            best_i[li] = best_i[li + s];
        }
        workgroupBarrier();
    }
    let idx = best_i[0];
    store(o, base, idx, li, 256u);
}
