// Shared by attention_grad_q.wgsl and attention_grad_kv.wgsl (AttentionGradQ / K / V): the
// head size and the uniform. Template slot: HEAD_DIM.

const HD: u32 = {{HEAD_DIM}}u;

