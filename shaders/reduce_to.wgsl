//#include "common.wgsl"
//#include "reduce.wgsl"
// ReduceTo and SumRows (ir/ops/reductions.py): out = the sum of x over the axes broadcasting
// added or stretched. The lowering merges x's dimensions into at most 4 (padded with
// leading 1s), each either kept or reduced: out_dims holds the kept sizes (1 where
// reduced), red_dims the reduced ones (1 where kept), st x's element strides. Output
// element o sums x[base(o) + off(r)] over r < red_len, in increasing r.
// Two entry points: `per_element`, one invocation per output element looping over the
// reduction (coalesced for SumRows, whose kept dimension is innermost), and `per_group`,
// one workgroup per output element striding over the reduction then a tree reduction,
// for few outputs with long reductions (ReduceTo to [1], the GroupNorm bias gradient).

// Offset in x of the index ``idx`` laid out row-major over ``dims``.
fn offset(idx: u32, dims: vec4<u32>) -> u32 {
    var t = idx;
    let c3 = t % dims.w;
    t = t / dims.w;
    let c2 = t % dims.z;
    t = t / dims.z;
    let c1 = t % dims.y;
    let c0 = t / dims.y;
    return dot(vec4<u32>(c0, c1, c2, c3), p.st);
}

@compute @workgroup_size(256)
fn per_element(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) li: u32) {
    let o = linear_workgroup(wid, nwg) * 256u + li;
    if (o >= p.n) {
        return;
    }
    let base = offset(o, p.out_dims);
    var s = 0.0;
    for (var r = 0u; r < p.red_len; r = r + 1u) {
        s = s + x[base + offset(r, p.red_dims)];
    }
    out[o] = s;
}

@compute @workgroup_size(256)
fn per_group(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) li: u32) {
    let o = linear_workgroup(wid, nwg);
    if (o >= p.n) {
        return;
    }
    let base = offset(o, p.out_dims);
    var s = 0.0;
    for (var r = li; r < p.red_len; r = r + RED) {
        s = s + x[base + offset(r, p.red_dims)];
    }
    let total = workgroup_sum(li, s);
    if (li == 0u) {
        out[o] = total;
    }
}
