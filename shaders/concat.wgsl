//#include "common.wgsl"
// Concat of up to 16 tensors along one axis (ir.ops_fused Concat), one output element per
// invocation, 256 per workgroup. Every tensor is viewed as [outer, width, inner], with
// outer the product of the dims before the axis and inner of those after it, so any rank
// and axis work. A dispatch writes the positions [base, base + part) along the axis, from
// its inputs x0, x1, ... (all of the Concat's, or a run of them when the lowering splits a
// Concat that binds too many storage buffers): out[o, base + c, r] comes from input t with
// off(t) <= c < off(t + 1).
// Template slots: T (f32 or u32; elements are copied, never converted), INPUTS (the
// bindings x0, x1, ...), SELECT (the branch per input), OUT and UNIFORM.

struct Params {
    off: array<vec4<u32>, 5>,  // off[t]: first position of input t in this part; then its width
    n: u32,                    // output elements this dispatch writes (outer * part * inner)
    width: u32,                // output size along the axis
    inner: u32,                // product of the dims after the axis
    base: u32,                 // the output position along the axis of this part's first input
    part: u32,                 // this part's size along the axis
}

{{INPUTS}}
@group(0) @binding({{OUT}}) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding({{UNIFORM}}) var<uniform> p: Params;

fn off(t: u32) -> u32 {
    return p.off[t / 4u][t % 4u];
}

// Index of out[o, base + c, r] inside input t.
fn at(t: u32, o: u32, c: u32, r: u32) -> u32 {
    return (o * (off(t + 1u) - off(t)) + c - off(t)) * p.inner + r;
}

fn element(o: u32, c: u32, r: u32) -> {{T}} {
{{SELECT}}
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    let r = i % p.inner;
    let t = i / p.inner;
    let o = t / p.part;
    let c = t % p.part;
    out[(o * p.width + p.base + c) * p.inner + r] = element(o, c, r);
}
