//#include "common.wgsl"
//#include "reduce.wgsl"
//#include "arith.wgsl"
//#include "token_pool_rows.wgsl"
// TokenPool (ir/ops/token_pool.py) with each sentence's tokens spread over CHUNKS workgroups, in one
// dispatch: out[b] = sum_t w[b, t] x[b, t] / c_b, c_b = max(sum_t w[b, t], p.min_count) when MEAN else 1,
// then out[b] / max(|out[b]|, p.min_norm) when NORMALIZE (token_pool.wgsl's formula; that kernel takes a
// workgroup per sentence, latency-bound on a few multiprocessors where the batch is small).
// x is [batch, s, cols] units (VEC: vec4<f32> where the row holds quads, else f32), w [batch, s] (read by
// WEIGHT: f32 or i32), out [batch, cols] units.
//
// Workgroup (b, c) takes rows [c, c + 1) * p.chunk_rows of sentence b: its 256 invocations are p.groups
// row groups of p.unit_lanes lanes, lane u of group g summing rows g, g + groups, ... of its chunk for
// unit u0 + u of each chunk of units u0 (STEP rows a step, their loads before their sums); the groups'
// sums meet in workgroup memory and group 0 stores the chunk's sum of each unit into the binding sums
// (the node's scratch buffer, [batch, CHUNKS, cols] units, float e of a unit in plane e) as u32 atomics.
// Then the workgroup counts its arrival on the sentence's counter (count, the node's u32s: zero between
// dispatches), and the workgroup that arrives last adds the CHUNKS sums of every unit in chunk order,
// divides by the count, stores out[b] and normalises it; no workgroup waits for another. The pattern is
// matmul.wgsl's LAST_SPLIT (ir/ops/matmul_kernel.py last_split): storageBarrier has device scope in naga's
// SPIR-V, and the sums are atomics because naga declares storage buffers without the Coherent decoration
// (only atomics are sure to carry a store from one workgroup to another across those barriers); on Metal
// the lowering keeps token_pool.wgsl. Every w[b, t] is multiplied in, so a NaN or infinity of x under a
// zero weight gives NaN as the reference's sum does; the clamps are max_f32 and divide as in
// token_pool.wgsl.

const CHUNKS: u32 = {{CHUNKS}}u;

var<workgroup> arrived: u32;

// put_sum(at, v) and get_sum(at): unit `at` of the [batch, CHUNKS, cols] chunk sums, float e in plane e
{{SUMS}}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let wg = linear_workgroup(wid, nwg);
    if (wg >= p.batch * CHUNKS) {
        return;
    }
    let b = wg / CHUNKS;
    let c = wg % CHUNKS;
    let g = li / p.unit_lanes;
    let u = li % p.unit_lanes;
    let rows = b * p.s;
    let t_end = min(p.s, (c + 1u) * p.chunk_rows);
    for (var u0 = 0u; u0 < p.cols; u0 = u0 + p.unit_lanes) {
        let col = u0 + u;
        part[li] = group_sum(rows, c * p.chunk_rows, t_end, g, col);
        workgroupBarrier();
        if (g == 0u && col < p.cols) {
            put_sum((b * CHUNKS + c) * p.cols + col, groups_total(u));
        }
        workgroupBarrier();
    }
    storageBarrier();  // this chunk's sums, before its arrival is counted
    if (li == 0u) {
        arrived = atomicAdd(&count[b], 1u);
    }
    if (workgroupUniformLoad(&arrived) + 1u < CHUNKS) {
        return;  // another chunk of the sentence is still to finish, and adds the sums
    }
    storageBarrier();  // the other chunks' sums, stored (atomically) before their arrivals
    if (li == 0u) {
        atomicStore(&count[b], 0u);  // zero again for the next dispatch
    }
    var count_w = 1.0;
    if ({{MEAN}}) {
        var n = 0.0;
        for (var t = li; t < p.s; t = t + 256u) {
            n = n + weight(rows + t);
        }
        count_w = max_f32(workgroup_sum(li, n), p.min_count);
    }
    var sq = 0.0;
    for (var col = li; col < p.cols; col = col + 256u) {
        var total = get_sum(b * CHUNKS * p.cols + col);
        for (var k = 1u; k < CHUNKS; k = k + 1u) {
            total = total + get_sum((b * CHUNKS + k) * p.cols + col);
        }
        total = total / count_w;
        out[b * p.cols + col] = total;
        sq = sq + squares(total);
    }
    if ({{NORMALIZE}}) {
        let norm = max_f32(sqrt(workgroup_sum(li, sq)), p.min_norm);
        for (var col = li; col < p.cols; col = col + 256u) {
            out[b * p.cols + col] = out[b * p.cols + col] / norm;
        }
    }
}
