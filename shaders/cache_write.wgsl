//#include "common.wgsl"
// CacheWrite (ir/ops/kv_cache.py): cache[pos + r, c] <- new_rows[r, col_start + c] in place, one
// invocation per element of the window [n, width] (new_rows' rows are in_stride apart). A row that would land at or past the cache's last row
// (pos + r >= rows) is skipped, so a bad position never writes outside the cache (the
// reference refuses it).

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    let r = i / p.width;
    if (pos[0] >= p.rows || r >= p.rows - pos[0]) {  // pos + r >= rows, without overflow
        return;
    }
    let c = i % p.width;
    cache[(pos[0] + r) * p.width + c] = new_rows[r * p.in_stride + p.col_start + c];
}
