//#include "common.wgsl"
// Einsum (ir/ops/linalg.py): out[e] = sum over the summed letters of the product of the
// operands x0, x1, ... (PRODUCT) at their offsets. Letters 0 .. n_out - 1 are the output's
// (decoded from e, the last fastest), letters n_out .. letters - 1 the summed ones (decoded
// from the running count c < summed); letter l moves operand i by p.s<i>[l] elements (the sum
// of its strides where the letter repeats: a diagonal; 0 where the operand broadcasts or
// lacks it). One invocation per output element, 256 per workgroup.

fn letter(a: array<vec4<u32>, 3>, l: u32) -> u32 {
    return a[l / 4u][l % 4u];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let e = linear_workgroup(wid, nwg) * 256u + li;
    if (e >= p.n) {
        return;
    }
    var base = vec3<u32>();
    var rest = e;
    for (var l = p.n_out; l > 0u; l = l - 1u) {
        let size = letter(p.size, l - 1u);
        let v = rest % size;
        rest = rest / size;
        base = base + v * vec3<u32>(letter(p.s0, l - 1u), letter(p.s1, l - 1u), letter(p.s2, l - 1u));
    }
    var acc = 0.0;
    for (var c = 0u; c < p.summed; c = c + 1u) {
        var off = base;
        var r = c;
        for (var l = p.letters; l > p.n_out; l = l - 1u) {
            let size = letter(p.size, l - 1u);
            let v = r % size;
            r = r / size;
            off = off + v * vec3<u32>(letter(p.s0, l - 1u), letter(p.s1, l - 1u), letter(p.s2, l - 1u));
        }
        acc = acc + {{PRODUCT}};
    }
    out[e] = acc;
}
