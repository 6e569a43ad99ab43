//#include "common.wgsl"
// RotaryEmbedding (ir/ops/transformer.py rotary_embedding_ref): ONNX's rotary embedding with
// cos / sin caches (https://onnx.ai/onnx/operators/onnx__RotaryEmbedding.html), one output
// element per invocation, 256 per workgroup. Element d < rot of a head is one half of the
// pair (i, i + rot/2) (interleaved 0) or (2i, 2i + 1) (interleaved 1): the first becomes
// cos x1 - sin x2, the second sin x1 + cos x2, with the cache row of the token's position
// (POSITION: position_ids[b, s] clamped into the cache, or b * seq + s of a [B, S, rot/2]
// cache); elements d >= rot are copied. x is [B, H, S, D] (bhsd 1) or [B, S, H*D].

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    let d = i % p.hd;
    if (d >= p.rot) {
        out[i] = x[i];
        return;
    }
    let row = i / p.hd;  // (b, h, s) or (b, s, h), outermost first
    var s = 0u;
    var b = 0u;
    if (p.bhsd != 0u) {
        s = row % p.seq;
        b = row / (p.seq * p.nh);
    } else {
        s = (row / p.nh) % p.seq;
        b = row / (p.seq * p.nh);
    }
    let half = p.rot / 2u;
    let head = i - d;
    var pair = 0u;
    var first = true;
    var x1 = 0.0;
    var x2 = 0.0;
    if (p.interleaved != 0u) {
        pair = d / 2u;
        first = d % 2u == 0u;
        x1 = x[head + 2u * pair];
        x2 = x[head + 2u * pair + 1u];
    } else {
        pair = d % half;
        first = d < half;
        x1 = x[head + pair];
        x2 = x[head + pair + half];
    }
    let pos = {{POSITION}};
    let c = cos_cache[pos * half + pair];
    let sn = sin_cache[pos * half + pair];
    out[i] = select(sn * x1 + c * x2, c * x1 - sn * x2, first);
}
