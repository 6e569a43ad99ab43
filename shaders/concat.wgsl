//#include "common.wgsl"
// Concat along one axis (ir/ops/shape.py), one output element per invocation, 256 per
// workgroup. Every tensor is viewed as [outer, width, inner], with outer the product of the
// dims before the axis and inner of those after it, so any rank and axis work. A dispatch
// binds up to 16 inputs x0, x1, ... and writes their part of the output, positions
// chunk_start .. chunk_start + chunk_width along the axis (a Concat of more inputs is several
// dispatches); out[o, c, r] comes from input t with off(t) <= c < off(t + 1).
// Template slots: T (f32 or u32; elements are copied, never converted), SELECT (the branch
// per input).

fn off(t: u32) -> u32 {
    return p.off[t / 4u][t % 4u];
}

// Index of out[o, c, r] inside input t.
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
    let c = p.chunk_start + t % p.chunk_width;
    let o = t / p.chunk_width;
    out[(o * p.width + c) * p.inner + r] = element(o, c, r);
}
