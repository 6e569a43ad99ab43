//#include "common.wgsl"
//#include "axes_common.wgsl"
// TopKValues and TopKIndices (ir/ops/scans.py): the k best elements of each line along one
// axis, best first. x is viewed as [outer, n, inner] (line o of p.lines = outer * inner
// starts at (o / inner) * n * inner + o % inner, element j is j * inner further), the
// output as [outer, k, inner]. One invocation per input element counts the elements of its
// line that beat it: that count is its rank, and an element of rank < k writes itself (its
// value, or its index as i32: STORE) at position rank. j beats i when x_j is larger (LARGEST)
// or smaller, or equal with j < i (ONNX TopK: the lower index first); a NaN is larger than
// every number, as numpy sorts it. Knowingly O(n^2) per line: fine for the lines TopK sees in
// practice (thousands), slow for very long ones. Slots: T (f32 or i32), NAN (the NaN test
// of v), LARGEST, STORE.

const LARGEST: bool = {{LARGEST}};

fn nan_of(v: {{T}}) -> bool {
    return {{NAN}};
}

// whether element (bv, bi) comes before (av, ai)
fn before(bv: {{T}}, bi: u32, av: {{T}}, ai: u32) -> bool {
    let bn = nan_of(bv);
    let an = nan_of(av);
    if (bn != an) {
        return bn == LARGEST;
    }
    if (bn || bv == av) {
        return bi < ai;
    }
    return select((bv < av), (bv > av), LARGEST);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let e = linear_workgroup(wid, nwg) * 256u + li;
    if (e >= p.lines * p.n) {
        return;
    }
    let o = e / p.n;
    let i = e % p.n;
    let outer = o / p.inner;
    let inner = o % p.inner;
    let base = outer * p.n * p.inner + inner;
    let v = x[base + i * p.inner];
    var rank = 0u;
    for (var j = 0u; j < p.n && rank < p.k; j = j + 1u) {
        if (before(x[base + j * p.inner], j, v, i)) {
            rank = rank + 1u;
        }
    }
    if (rank < p.k) {
        out[(outer * p.k + rank) * p.inner + inner] = {{STORE}};
    }
}
