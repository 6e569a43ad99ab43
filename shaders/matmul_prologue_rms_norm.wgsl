// matmul.wgsl hooks for FusedRmsNormMatMul: C = epilogue(RmsNorm(x, w_norm) op W)
// (Zhang & Sennrich 2019; ir/ops/matmul.py). The A slice stages
// x[i, k..k+3] * w_norm[k..k+3]; the store multiplies row i by 1 / sqrt(mean_k x[i, k]^2 + eps),
// which commutes with the product. The sums of squares come for free from the A loads:
// load r of invocation li reads quads of tile row (li + WG r) / KQ only (at columns
// (li + WG r) % KQ * 4 of every K slice), so it sums x^2 of that row in ss[r]; finish_rows
// adds the KQ partial sums of each row in workgroup memory.

var<private> ss: array<f32, A_LOADS>;  // ss[r]: partial sum of x^2 of tile row (li + WG r) / KQ

fn start_rows(li: u32, row0: u32) {}

fn w_norm_at(k: u32) -> f32 {
    return w_norm[min(k, p.k - 1u)];  // past K, x is 0 and the weight does not matter
}

fn stage_a(v: vec4<f32>, k: u32, r: u32) -> vec4<f32> {
    ss[r] = ss[r] + dot(v, v);  // 0 outside x
    return v * vec4<f32>(w_norm_at(k), w_norm_at(k + 1u), w_norm_at(k + 2u), w_norm_at(k + 3u));
}

// Float f of the slices' memory, free after the K loop: the partial sum of quad q at q, the sum of
// x^2 of tile row r at A_QUADS + r and its inverse rms at A_QUADS + BM + r.
fn scratch(f: u32) -> f32 {
    return tiles[f / 4u][f % 4u];
}

// Called after the K loop's last barrier, in uniform control flow.
fn finish_rows(li: u32) {
    for (var r = 0u; r < A_LOADS; r = r + 1u) {
        let q = li + WG * r;
        if (q < A_QUADS) {
            tiles[q / 4u][q % 4u] = ss[r];
        }
    }
    workgroupBarrier();
    if (li < BM) {
        var s = 0.0;
        for (var q = 0u; q < KQ; q = q + 1u) {
            s = s + scratch(li * KQ + q);
        }
        let f = A_QUADS + li;
        tiles[f / 4u][f % 4u] = s;
        let g = A_QUADS + BM + li;
        tiles[g / 4u][g % 4u] = 1.0 / sqrt(s / f32(p.k) + p.eps);
    }
    workgroupBarrier();
}

fn row_scale(tile_row: u32) -> f32 {
    return scratch(A_QUADS + BM + tile_row);
}

// SPLITS > 1: this workgroup's sums of x^2 (over its K elements) of its rows, at out[at + row].
fn write_row_sums(li: u32, row0: u32, at: u32) {
    if (li < BM && row0 + li < p.m) {
        put_row_sum(at + row0 + li, scratch(A_QUADS + li));
    }
}
