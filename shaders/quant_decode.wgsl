// Decoding of quantised rows (ir/ops/quant.py): the binding q (array<u32>) holds rows of
// llama.cpp blocks of 32 weights (ggml-common.h) or of float16 weights, p.row_words words a row, and
// dequant_quad_<format>(row, c) returns weights c..c+3 of that row (c % 4 == 0, c < the row's
// length; a quad never spans two blocks). d and m are float16, unpacked with core WGSL's
// unpack2x16float, so no shader-f16 feature is needed.

// The 4 bytes at byte offset `at` of q (at % 2 == 0: Q4_0 and Q8_0 blocks start at even bytes).
fn q_word(at: u32) -> u32 {
    let w = at / 4u;
    if (at % 4u == 0u) {
        return q[w];
    }
    return (q[w] >> 16u) | (q[w + 1u] << 16u);
}

// The float16 at byte offset `at` of q (at % 2 == 0).
fn q_half(at: u32) -> f32 {
    let h = unpack2x16float(q[at / 4u]);
    return select(h.x, h.y, at % 4u != 0u);
}

// The 4 nibbles of weights j..j+3 of a 4-bit block (j % 4 == 0): low nibbles of qs[j..j+3] for
// j < 16, high nibbles of qs[j-16..j-13] above; `w` holds those 4 bytes.
fn nibbles(w: u32, j: u32) -> vec4<f32> {
    let s = w >> select(0u, 4u, j >= 16u);
    return vec4<f32>((vec4<u32>(s, s >> 8u, s >> 16u, s >> 24u)) & vec4<u32>(15u));
}

// block_q4_1: d, m, qs[16] (20 bytes, 5 words): weight = d * nibble + m.
fn dequant_quad_q4_1(row: u32, c: u32) -> vec4<f32> {
    let at = row * p.row_words + c / 32u * 5u;
    let dm = unpack2x16float(q[at]);
    let j = c % 32u;
    return nibbles(q[at + 1u + j % 16u / 4u], j) * dm.x + dm.y;
}

// block_q4_0: d, qs[16] (18 bytes): weight = d * (nibble - 8).
fn dequant_quad_q4_0(row: u32, c: u32) -> vec4<f32> {
    let at = row * p.row_words * 4u + c / 32u * 18u;
    let j = c % 32u;
    return (nibbles(q_word(at + 2u + j % 16u), j) - 8.0) * q_half(at);
}

// block_q8_0: d, qs[32] int8 (34 bytes): weight = d * qs.
fn dequant_quad_q8_0(row: u32, c: u32) -> vec4<f32> {
    let at = row * p.row_words * 4u + c / 32u * 34u;
    let w = q_word(at + 2u + c % 32u);
    let v = vec4<i32>(bitcast<i32>(w << 24u), bitcast<i32>(w << 16u), bitcast<i32>(w << 8u), bitcast<i32>(w));
    return vec4<f32>(v >> vec4<u32>(24u)) * q_half(at);
}

// f16: 32 float16 weights a block (16 words), two a word, the lower half first: weights
// c..c+3 are words c/2 and c/2 + 1 of the row.
fn dequant_quad_f16(row: u32, c: u32) -> vec4<f32> {
    let at = row * p.row_words + c / 2u;
    return vec4<f32>(unpack2x16float(q[at]), unpack2x16float(q[at + 1u]));
}
