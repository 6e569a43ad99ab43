//#include "common.wgsl"
// SplitHeads (ir/ops/attention_general.py): out[b, h, s, d] = x[b, s, h * HD + d], the
// [B, S, H*D] -> [B, H, S, D] layout change of ONNX Attention's 3-D inputs; one output
// element per invocation, 256 per workgroup.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    let d = i % p.hd;
    let s = (i / p.hd) % p.seq;
    let h = (i / (p.hd * p.seq)) % p.nh;
    let b = i / (p.hd * p.seq * p.nh);
    out[i] = x[((b * p.seq + s) * p.nh + h) * p.hd + d];
}
