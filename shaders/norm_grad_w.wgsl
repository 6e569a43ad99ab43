//#include "common.wgsl"
//#include "reduce.wgsl"
// Weight gradients of the row norms (ir/ops/norms.py: LayerNormGradW, RmsNormGradW):
// dw[j] = sum_i dy[i, j] xhat[i, j], xhat = (x - mean_i) rstd_i for LayerNorm (CENTERED)
// and x r_i for RmsNorm. One workgroup per block of 256 columns, one invocation per
// column; the workgroup walks the M rows in order and recomputes each row's statistics
// together (the IR keeps no saved mean/rstd), so every block reads all of x:
// ceil(N / 256) * M * N loads plus 1 or 2 tree reductions per row and block, and only
// ceil(N / 256) workgroups run. The sum over rows is in row order (deterministic). Rows
// are centred about their first element as in norm_grad_x.wgsl.

const CENTERED: bool = {{CENTERED}};

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let blk = linear_workgroup(wid, nwg);
    if (blk >= p.blocks) {
        return;
    }
    let j = blk * 256u + li;
    let n = f32(p.n);
    var acc = 0.0;
    for (var row = 0u; row < p.rows; row = row + 1u) {
        let base = row * p.n;
        let x0 = select(0.0, x[base], CENTERED);
        var mean = 0.0;  // of x - x0
        if (CENTERED) {
            var s = 0.0;
            for (var e = li; e < p.n; e = e + RED) {
                s = s + (x[base + e] - x0);
            }
            mean = workgroup_sum(li, s) / n;
        }
        var q = 0.0;
        for (var e = li; e < p.n; e = e + RED) {
            let d = (x[base + e] - x0) - mean;
            q = q + d * d;
        }
        let rstd = 1.0 / sqrt(workgroup_sum(li, q) / n + p.eps);
        if (j < p.n) {
            acc = acc + dy[base + j] * ((x[base + j] - x0) - mean) * rstd;
        }
    }
    if (j < p.n) {
        out[j] = acc;
    }
}
