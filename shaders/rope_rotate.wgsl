//#include "common.wgsl"
// RoPE's rotation (Su et al. 2021, eq. 15) of x[rows, heads * head_dim] into out, shared by
// rope.wgsl (RoPE, RoPEGrad: the offset is a uniform field), rope_dynamic.wgsl
// (RoPEDynamic: the offset is an input) and cache_write_rope.wgsl (CacheWriteRoPE: out is
// the cache, written from row out_row0 on). The includer binds x and out; p holds the
// fields of ir/ops/transformer.py rope_params.
// Pair j of a head at row r rotates (x[i0], x[i1]) by the angle pos * inv_freq[j],
// pos = offset + r mod seq. Pairs are (j, j + head_dim/2) for the 'half' layout and
// (2j, 2j + 1) for 'adjacent'. inv_freq (ir.ops.rope_inv_freq) is computed on the host in
// float64 and passed in the uniform (head_dim <= 512).

// Rotate pair q (< p.n) with positions starting at `offset`; store it out_row0 rows down.
// Row r of x starts at r * x_stride + x_start (x_stride the width and x_start 0 but for
// CacheWriteRoPE reading its rows as columns of a wider, packed tensor).
fn rotate_pair(q: u32, offset: f32, out_row0: u32) {
    let r = q / p.half_width;
    let pp = q % p.half_width;
    let head = pp / p.half_hd;
    let j = pp % p.half_hd;
    let head_base = head * p.half_hd * 2u;
    var c0 = head_base + j;
    var c1 = c0 + p.half_hd;
    if (p.adjacent == 1u) {
        c0 = head_base + 2u * j;
        c1 = c0 + 1u;
    }
    let pos = f32(r % p.seq) + offset;
    let ang = reduce_angle(pos * p.inv_freq[j / 4u][j % 4u]);
    let c = cos(ang);
    let s = sin(ang);
    let x_row = r * p.x_stride + p.x_start;
    let x0 = x[x_row + c0];
    let x1 = x[x_row + c1];
    let out_row = (out_row0 + r) * p.half_width * 2u;
    out[out_row + c0] = x0 * c - x1 * s;
    out[out_row + c1] = x0 * s + x1 * c;
}
