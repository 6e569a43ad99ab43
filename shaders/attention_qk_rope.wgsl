// attention.wgsl hooks for CausalAttentionRoPE (ir.ops_fused): q and k are rotated as
// the RoPE op does (rope.wgsl; Su et al. 2021, eq. 15), pair t of a row by the angle
// pos * inv_freq[t]; pairs are (t, t + HD/2) for the 'half' layout and (2t, 2t + 1) for
// 'adjacent'. The query row is rotated once, as it is loaded; each K tile is rotated once
// in workgroup memory, right after it is loaded, so neither rotated tensor is ever stored.
// Positions: the op's position of row r is pos_offset + r mod seq, but a score depends
// only on the difference of the query's and the key's positions (Su et al. 2021:
// R(m)^T R(n) = R(n - m)), so the kernel uses pos = r mod seq: the same scores, without
// the f32 angle error that grows with pos_offset (outputs off by up to 0.3 at 10^6).

fn rope_pair(t: u32) -> vec2<u32> {
    if (p.adjacent == 1u) {
        return vec2<u32>(2u * t, 2u * t + 1u);
    }
    return vec2<u32>(t, t + HD / 2u);
}

fn rope_cos_sin(row: u32, t: u32) -> vec2<f32> {
    let ang = reduce_angle(f32(row) * p.inv_freq[t / 4u][t % 4u]);
    return vec2<f32>(cos(ang), sin(ang));
}

fn rope_angles4(row: u32, c: u32) -> vec4<f32> {
    // The angles of pairs 4c..4c+3, each reduced to [-pi, pi] as rope_cos_sin does.
    let a = f32(row) * p.inv_freq[c];
    let k = round(a * 0.15915494309189535);
    return (a - k * 6.28125) - k * 0.0019353071795864769;
}

// The query row is rotated with whole-vec4 arithmetic only: indexing a component of a
// private array with a run-time index makes the NVIDIA compiler move the whole row to
// local memory, which made every score read slow.
fn load_q(qv: ptr<function, array<vec4<f32>, HD4>>, q_base: u32, row: u32) {
    if (p.adjacent == 1u) {  // vec4 c holds pairs 2c and 2c+1: (a0, b0, a1, b1)
        for (var c = 0u; c < HD4; c = c + 1u) {
            let v = {{Q}}4(q_base, c);
            var ang = vec2<f32>(0.0);
            if (2u * c + 1u < HD / 2u) {
                let a4 = rope_angles4(row, (2u * c) / 4u);
                let lo = (2u * c) % 4u;
                ang = vec2<f32>(a4[lo], a4[lo + 1u]);
            } else if (2u * c < HD / 2u) {
                ang = vec2<f32>(rope_angles4(row, (2u * c) / 4u)[(2u * c) % 4u], 0.0);
            }
            let cc = vec4<f32>(cos(ang.x), cos(ang.x), cos(ang.y), cos(ang.y));
            let ss = vec4<f32>(sin(ang.x), sin(ang.x), sin(ang.y), sin(ang.y));
            (*qv)[c] = v * cc + vec4<f32>(-v.y, v.x, -v.w, v.z) * ss;
        }
    } else if ((HD / 2u) % 4u == 0u) {  // 'half': vec4 c pairs with vec4 c + HD/8
        let h4 = HD4 / 2u;
        for (var c = 0u; c < h4; c = c + 1u) {
            let x0 = {{Q}}4(q_base, c);
            let x1 = {{Q}}4(q_base, c + h4);
            let ang = rope_angles4(row, c);
            let cs = cos(ang);
            let sn = sin(ang);
            (*qv)[c] = x0 * cs - x1 * sn;
            (*qv)[c + h4] = x0 * sn + x1 * cs;
        }
    } else {  // a head size whose halves are not whole vec4s: element by element
        for (var t = 0u; t < HD / 2u; t = t + 1u) {
            let i = rope_pair(t);
            let cs = rope_cos_sin(row, t);
            let x0 = {{Q}}1(q_base + i.x);
            let x1 = {{Q}}1(q_base + i.y);
            (*qv)[i.x / 4u][i.x % 4u] = x0 * cs.x - x1 * cs.y;
            (*qv)[i.y / 4u][i.y % 4u] = x0 * cs.y + x1 * cs.x;
        }
    }
}

// Rotates the nk key rows of k_tile (key k0 + j of the sequence in row j); every
// invocation of the workgroup calls it.
fn prepare_k_tile(li: u32, k0: u32, nk: u32) {
    for (var i = li; i < nk * (HD / 2u); i = i + BQ) {
        let j = i / (HD / 2u);
        let t = i % (HD / 2u);
        let pr = rope_pair(t) + vec2<u32>(j * HD4 * 4u);
        let cs = rope_cos_sin(k0 + j, t);
        let x0 = k_tile[pr.x / 4u][pr.x % 4u];
        let x1 = k_tile[pr.y / 4u][pr.y % 4u];
        k_tile[pr.x / 4u][pr.x % 4u] = x0 * cs.x - x1 * cs.y;
        k_tile[pr.y / 4u][pr.y % 4u] = x0 * cs.y + x1 * cs.x;
    }
    workgroupBarrier();
}
