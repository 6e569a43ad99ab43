//#include "common.wgsl"
// The strided copy of ir/ops/movement.py (Permute, Slice, Expand, Pad, Tile): one output
// element per invocation, 256 per workgroup. Output element i is split into coordinates
// c[d] over p.dims (row-major, p.rank <= 8 dimensions after the lowering merged contiguous
// ones); each gives an input coordinate j = c[d], which FOLD may shift by p.off[d] and fold
// into [0, p.ext[d]) (a pad mode: edge, reflect, wrap, or the constant p.fill outside it),
// and the element read is x[p.base + sum_d j * p.coef[d]] (i32: a negative coef walks an axis
// backwards, a zero coef broadcasts it). Elements are copied, never converted.
// Template slot: FOLD (empty for a plain strided view).

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_workgroup(wid, nwg) * 256u + li;
    if (i >= p.n) {
        return;
    }
    var t = i;
    var addr = p.base;
    for (var k = 0u; k < p.rank; k = k + 1u) {
        let d = p.rank - 1u - k;
        let size = p.dims[d / 4u][d % 4u];
        var j = i32(t % size);
        t = t / size;
{{FOLD}}
        addr = addr + j * p.coef[d / 4u][d % 4u];
    }
    out[i] = x[u32(addr)];
}
