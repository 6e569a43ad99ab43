//#include "common.wgsl"
// C[M,N] = epilogue(op(A) @ op(B)) for MatMul, MatMulAT, MatMulBT and FusedMatMul.
// Template slots (filled by lowering/kernels.py): A_INDEX and B_INDEX address
// element (i, kk) of op(A) and (kk, j) of op(B) for the variant; OPERANDS declares
// the epilogue operand bindings; EPILOGUE is the chain applied to each result;
// B, OUT and UNIFORM are binding numbers. PROLOGUE defines the hooks stage_a (the value
// staged for element (i, kk) of op(A)), finish_rows (called once after the K loop, in
// uniform control flow) and row_scale (a factor per tile row applied before the
// epilogue): matmul_prologue_none.wgsl, or matmul_prologue_rms_norm.wgsl for
// FusedRmsNormMatMul.
//
// One workgroup computes a 64x64 tile of C with 16x16 invocations, each a 4x4
// micro-tile (rows ty + 16r, columns tx + 16c, so neighbouring invocations store
// neighbouring columns). K is walked in slices of 16 staged in workgroup memory.
// Every load and store is bounds-checked, so any M, K, N works.

struct Params {
    m: u32,
    k: u32,
    n: u32,
    tiles_n: u32,  // column tiles, ceil(N / 64)
    tiles: u32,    // all tiles, ceil(M / 64) * tiles_n
    eps: f32,      // RmsNorm prologue only
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding({{B}}) var<storage, read> b: array<f32>;
{{OPERANDS}}
@group(0) @binding({{OUT}}) var<storage, read_write> out: array<f32>;
@group(0) @binding({{UNIFORM}}) var<uniform> p: Params;

const TILE: u32 = 64u;
const TK: u32 = 16u;
var<workgroup> a_tile: array<f32, 1024>;  // [TK][TILE]: a_tile[kk * TILE + i]
var<workgroup> b_tile: array<f32, 1024>;  // [TK][TILE]: b_tile[kk * TILE + j]

fn load_a(i: u32, kk: u32) -> f32 {
    if (i >= p.m || kk >= p.k) {
        return 0.0;
    }
    return a[{{A_INDEX}}];
}

fn load_b(kk: u32, j: u32) -> f32 {
    if (kk >= p.k || j >= p.n) {
        return 0.0;
    }
    return b[{{B_INDEX}}];
}

{{PROLOGUE}}

fn epilogue(i: u32, j: u32, acc: f32) -> f32 {
    var v = acc;
{{EPILOGUE}}
    return v;
}

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let tile = linear_workgroup(wid, nwg);
    if (tile >= p.tiles) {
        return;
    }
    let row0 = (tile / p.tiles_n) * TILE;
    let col0 = (tile % p.tiles_n) * TILE;
    var acc: array<vec4<f32>, 4>;
    for (var k0 = 0u; k0 < p.k; k0 = k0 + TK) {
        for (var r = 0u; r < 4u; r = r + 1u) {
            let l = li + 256u * r;
            let ia = l / TK;
            let ka = l % TK;
            a_tile[ka * TILE + ia] = stage_a(r, row0 + ia, k0 + ka);
            let jb = l % TILE;
            let kb = l / TILE;
            b_tile[kb * TILE + jb] = load_b(k0 + kb, col0 + jb);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk = kk + 1u) {
            let base = kk * TILE;
            let bv = vec4<f32>(b_tile[base + lid.x], b_tile[base + lid.x + 16u],
                               b_tile[base + lid.x + 32u], b_tile[base + lid.x + 48u]);
            for (var r = 0u; r < 4u; r = r + 1u) {
                acc[r] = acc[r] + a_tile[base + lid.y + 16u * r] * bv;
            }
        }
        workgroupBarrier();
    }
    finish_rows(li);
    for (var r = 0u; r < 4u; r = r + 1u) {
        let i = row0 + lid.y + 16u * r;
        let scale = row_scale(lid.y + 16u * r);
        for (var c = 0u; c < 4u; c = c + 1u) {
            let j = col0 + lid.x + 16u * c;
            if (i < p.m && j < p.n) {
                out[i * p.n + j] = epilogue(i, j, acc[r][c] * scale);
            }
        }
    }
}
