//#include "derivatives.wgsl"
// SwiGLUConcatGrad (ir/ops/elementwise.py): for x [M, 2N] = [gate | up] and dy [M, N],
// out[i, j] = dy * up * silu'(gate) for j < N and dy * silu(gate) at column N + j.
// One output element per invocation, 256 per workgroup.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    let row = i / (2u * p.half);
    let c = i % (2u * p.half);
    let j = c % p.half;
    let gate = x[row * 2u * p.half + j];
    let g = dy[row * p.half + j];
    if (c < p.half) {
        out[i] = g * x[row * 2u * p.half + p.half + j] * dsilu(gate);
    } else {
        out[i] = g * silu(gate);
    }
}
