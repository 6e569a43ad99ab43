// Shared by attention_grad_q.wgsl and attention_grad_kv.wgsl (AttentionGradQ / K / V): the
// head size and the uniform. Template slot: HEAD_DIM.

const HD: u32 = {{HEAD_DIM}}u;

struct Params {
    seq: u32,
    nh: u32,
    nkv: u32,
    group: u32,   // nh / nkv
    blocks: u32,  // ceil(seq / 64)
    total: u32,   // batch * blocks workgroups, times nh (dq) or nkv (dk, dv)
    scale: f32,   // 1 / sqrt(HD)
}
