//#include "common.wgsl"
// CacheWrite (ir.ops_cache): cache[pos + r, c] <- new_rows[r, c] in place, one invocation per
// element of new_rows [n, width]. A row that would land at or past the cache's last row
// (pos + r >= rows) is skipped, so a bad position never writes outside the cache (the
// reference refuses it).

struct Params {
    n: u32,      // elements of new_rows, n * width
    width: u32,  // row width of the cache and of new_rows
    rows: u32,   // cache rows, max_seq
}

@group(0) @binding(0) var<storage, read> new_rows: array<f32>;
@group(0) @binding(1) var<storage, read> pos: array<u32>;
@group(0) @binding(2) var<storage, read_write> cache: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

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
    cache[(pos[0] + r) * p.width + i % p.width] = new_rows[i];
}
