//#include "common.wgsl"
// ReverseSequence (ir/ops/movement.py): x viewed as [steps, batch, inner] (p.time_first = 1)
// or [batch, steps, inner]; out[t, b] = x[len - 1 - t, b] for t < len, x[t, b] after it, with
// len = sequence_lens[b] clamped to [0, steps]. One element per invocation, 256 per workgroup.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    let r = i % p.inner;
    let q = i / p.inner;
    var t = q % p.steps;
    var b = q / p.steps;
    if (p.time_first == 1u) {
        b = q % p.batch;
        t = q / p.batch;
    }
    let len = u32(clamp(sequence_lens[b], 0, i32(p.steps)));
    let src = select(t, len - 1u - t, t < len);
    var at = (b * p.steps + src) * p.inner + r;
    if (p.time_first == 1u) {
        at = (src * p.batch + b) * p.inner + r;
    }
    out[i] = x[at];
}
