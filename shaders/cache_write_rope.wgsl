//#include "rope_rotate.wgsl"
// CacheWriteRoPE (ir/ops/kv_cache.py): CacheWrite(cache, RoPEDynamic(x, pos), pos) in one pass.
// One invocation per rotated pair of x [n, width] (rope_rotate.wgsl, positions from
// pos[0], the uniform's pos_offset 0 and seq n), stored at cache row pos + r in place, so
// the rotated rows are never written anywhere else. As in cache_write.wgsl, a row that
// would land at or past the cache's last row (pos + r >= rows) is skipped.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let q = linear_workgroup(wid, nwg) * 256u + li;
    if (q >= p.n) {
        return;
    }
    let rows = arrayLength(&out) / (p.half_width * 2u);
    let r = q / p.half_width;
    if (pos[0] >= rows || r >= rows - pos[0]) {  // pos + r >= rows, without overflow
        return;
    }
    rotate_pair(q, f32(pos[0]), pos[0]);
}
