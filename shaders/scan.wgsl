//#include "common.wgsl"
// CumSum, CumProd and PaddedPositionIds (ir/ops/scans.py) along one axis: x is viewed as [outer, n, inner];
// line o of p.lines = outer * inner starts at (o / inner) * n * inner + o % inner, its
// element j is j * inner further. Element k of a line in scan order is element k, or
// n - 1 - k when REVERSE; out = combine of the elements up to it (EXCLUSIVE: before it,
// starting from the identity). Slots: T (f32 or i32; i32 wraps), COMBINE of a and b,
// IDENTITY. Entry points: `per_element`, an invocation per line scanning it in order
// (short lines); `per_group`, a workgroup per line scanning chunks of 256 in workgroup memory
// (Hillis & Steele 1986) and carrying each chunk's total into the next. PROLOGUE is the body of
// prologue(v), what an element of x adds to the scan, and EPILOGUE the body of epilogue(acc, v), what
// is stored for an element of x whose running value is acc (CumSum, CumProd: v and acc).

const EXCLUSIVE: bool = {{EXCLUSIVE}};
const REVERSE: bool = {{REVERSE}};

var<workgroup> sh: array<{{T}}, 256>;

fn combine(a: {{T}}, b: {{T}}) -> {{T}} {
    return {{COMBINE}};
}

fn prologue(v: {{T}}) -> {{T}} {
    {{PROLOGUE}}
}

fn epilogue(acc: {{T}}, v: {{T}}) -> {{T}} {
    {{EPILOGUE}}
}

// the input / output index of element k (in scan order) of the line starting at base
fn pos(base: u32, k: u32) -> u32 {
    return base + select(k, p.n - 1u - k, REVERSE) * p.inner;
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
    var acc: {{T}} = {{IDENTITY}};
    for (var k = 0u; k < p.n; k = k + 1u) {
        let i = pos(base, k);
        let xi = x[i];
        let v = prologue(xi);
        if (EXCLUSIVE) {
            out[i] = epilogue(acc, xi);
            acc = combine(acc, v);
        } else {
            acc = combine(acc, v);
            out[i] = epilogue(acc, xi);
        }
    }
}

@compute @workgroup_size(256)
fn per_group(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) li: u32) {
    let o = linear_workgroup(wid, nwg);
    if (o >= p.lines) {
        return;
    }
    let base = line_base(o);
    var carry: {{T}} = {{IDENTITY}};
    for (var start = 0u; start < p.n; start = start + 256u) {
        let k = start + li;
        var v: {{T}} = {{IDENTITY}};  // past the line: the identity, not prologue's value of anything
        var xk: {{T}} = {{IDENTITY}};
        if (k < p.n) {
            xk = x[pos(base, k)];
            v = prologue(xk);
        }
        sh[li] = v;
        workgroupBarrier();
        for (var off = 1u; off < 256u; off = off * 2u) {
            var t = sh[li];
            if (li >= off) {
                t = combine(sh[li - off], t);
            }
            workgroupBarrier();
            sh[li] = t;
            workgroupBarrier();
        }
        // sh[li]: the chunk's inclusive scan up to li
        var r = combine(carry, sh[li]);
        if (EXCLUSIVE) {
            r = select(combine(carry, sh[max(li, 1u) - 1u]), carry, li == 0u);
        }
        if (k < p.n) {
            out[pos(base, k)] = epilogue(r, xk);
        }
        let total = sh[255];
        workgroupBarrier();
        carry = combine(carry, total);
    }
}
