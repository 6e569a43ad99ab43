// What TokenPool's kernels (token_pool.wgsl, token_pool_chunks.wgsl; ir/ops/token_pool.py) share: x's rows
// weighted and summed by row groups. A workgroup's 256 invocations are p.groups row groups of p.unit_lanes lanes
// (li = g * p.unit_lanes + u); VEC is vec4<f32> where a row holds quads, else f32.

const STEP: u32 = {{STEP}}u;

var<workgroup> part: array<{{VEC}}, 256>;

fn weight(i: u32) -> f32 {
    return f32(w[i]);
}

fn squares(v: {{VEC}}) -> f32 {
    return {{SQUARES}};
}

// Lane u of group g: the sum of w[rows + t] x[rows + t, col] over t = t0 + g, t0 + g + groups, ... below
// t_end, STEP rows a step with their loads before their sums; zero for a group past p.groups or col past p.cols.
fn group_sum(rows: u32, t0: u32, t_end: u32, g: u32, col: u32) -> {{VEC}} {
    var acc = {{VEC}}(0.0);
    if (g < p.groups && col < p.cols) {
        var t = t0 + g;
        let step = p.groups;
        for (; t + (STEP - 1u) * step < t_end; t = t + STEP * step) {
            var xs: array<{{VEC}}, STEP>;
            for (var k = 0u; k < STEP; k = k + 1u) {
                xs[k] = x[(rows + t + k * step) * p.cols + col];
            }
            for (var k = 0u; k < STEP; k = k + 1u) {
                acc = acc + weight(rows + t + k * step) * xs[k];
            }
        }
        for (; t < t_end; t = t + step) {
            acc = acc + weight(rows + t) * x[(rows + t) * p.cols + col];
        }
    }
    return acc;
}

// The groups' sums of unit u, in group order, once every lane has stored its group_sum at part[li] (behind a
// workgroupBarrier).
fn groups_total(u: u32) -> {{VEC}} {
    var total = part[u];
    for (var k = 1u; k < p.groups; k = k + 1u) {
        total = total + part[k * p.unit_lanes + u];
    }
    return total;
}
