//#include "common.wgsl"
// Resample (ir/ops/resample.py): one invocation per output element, 256 per workgroup. The
// axes (runs of untouched ones merged; p.rank of them, the last fastest) have input sizes
// p.ins and output sizes p.outs; an untouched axis (p.taps 0) keeps its coordinate, a
// resized one reads the p.taps[a] entries of its table row o (at p.row0[a] + o * taps) of
// index (input coordinate, or -1 in the first entry: outside the input) and weight. The
// result sums, over every combination of one tap per resized axis (p.combos of them), the
// product of the taps' weights times x there; an output outside on any axis is
// p.extrapolation.

fn axis_of(a: array<vec4<u32>, 2>, i: u32) -> u32 {
    return a[i / 4u][i % 4u];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let e = linear_workgroup(wid, nwg) * 256u + li;
    if (e >= p.total) {
        return;
    }
    var rows: array<u32, 8>;     // the table row of each resized axis
    var strides: array<u32, 8>;  // elements of x per step along each axis
    var rest = e;
    var base = 0u;
    var stride = 1u;
    for (var a = p.rank; a > 0u; a = a - 1u) {
        let ax = a - 1u;
        let o = rest % axis_of(p.outs, ax);
        rest = rest / axis_of(p.outs, ax);
        let t = axis_of(p.taps, ax);
        if (t == 0u) {
            base = base + o * stride;
        } else {
            rows[ax] = axis_of(p.row0, ax) + o * t;
            if (index[rows[ax]] < 0) {
                out[e] = p.extrapolation;
                return;
            }
        }
        strides[ax] = stride;
        stride = stride * axis_of(p.ins, ax);
    }
    var acc = 0.0;
    for (var c = 0u; c < p.combos; c = c + 1u) {
        var r = c;
        var at = base;
        var wt = 1.0;
        for (var a = p.rank; a > 0u; a = a - 1u) {
            let ax = a - 1u;
            let t = axis_of(p.taps, ax);
            if (t == 0u) {
                continue;
            }
            let k = rows[ax] + r % t;
            r = r / t;
            at = at + u32(index[k]) * strides[ax];
            wt = wt * weight[k];
        }
        acc = fma(wt, x[at], acc);
    }
    out[e] = acc;
}
