//#include "common.wgsl"
// MaxPool, MaxPoolIndices, AveragePool and LpPool (ir/ops/pooling.py): one invocation per
// output element, scanning its window over up to 3 spatial axes (d, h, w; fewer axes are
// padded with size-1 ones). Output (plane, y) reads input positions y s + t dil - pad along
// each axis, t < kernel; a tap outside the input never counts. MODE: 0 the maximum (the
// first in row-major tap order on ties; -inf for a window with no tap inside), 3 its flat
// index into x, i32 (row-major or, p.col_major, column-major over the spatial axes, plus
// plane * spatial size; -1 for none), 1 the mean (over the taps inside, or with
// p.include_pad over those before the end padding), 2 (sum |x|^p)^(1/p). STORE writes the result of the MODE.

const MODE: u32 = {{MODE}}u;

// The input coordinate of tap t along an axis (may lie outside [0, n_in)).
fn tap_pos(o: u32, t: u32, s: u32, d: u32, pad: i32) -> i32 {
    return i32(o * s + t * d) - pad;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let e = linear_workgroup(wid, nwg) * 256u + li;
    if (e >= p.total) {
        return;
    }
    let ow = e % p.outs.z;
    let oh = (e / p.outs.z) % p.outs.y;
    let od = (e / (p.outs.z * p.outs.y)) % p.outs.x;
    let spatial = p.ins.x * p.ins.y * p.ins.z;
    let plane = e / (p.outs.x * p.outs.y * p.outs.z);
    let base = plane * spatial;
    let n_in = vec3<i32>(p.ins.xyz);
    var found = false;
    var best = 0.0;
    var at = 0u;
    var total = 0.0;
    var count = 0u;
    for (var td = 0u; td < p.ker.x; td = td + 1u) {
        let id = tap_pos(od, td, p.stride.x, p.dil.x, p.pad.x);
        for (var th = 0u; th < p.ker.y; th = th + 1u) {
            let ih = tap_pos(oh, th, p.stride.y, p.dil.y, p.pad.y);
            for (var tw = 0u; tw < p.ker.z; tw = tw + 1u) {
                let iw = tap_pos(ow, tw, p.stride.z, p.dil.z, p.pad.z);
                let pos = vec3<i32>(id, ih, iw);
                let inside = all(pos >= vec3<i32>(0)) && all(pos < n_in);
                if (p.include_pad != 0u && all(pos < n_in + p.pad_end.xyz)) {
                    count = count + 1u;
                }
                if (!inside) {
                    continue;
                }
                let q = vec3<u32>(pos);
                let v = x[base + (q.x * p.ins.y + q.y) * p.ins.z + q.z];
                if (MODE == 0u || MODE == 3u) {
                    if (!found || v > best) {
                        found = true;
                        best = v;
                        if (p.col_major != 0u) {
                            at = (q.z * p.ins.y + q.y) * p.ins.x + q.x;
                        } else {
                            at = (q.x * p.ins.y + q.y) * p.ins.z + q.z;
                        }
                    }
                } else if (MODE == 1u) {
                    total = total + v;
                    if (p.include_pad == 0u) {
                        count = count + 1u;
                    }
                } else {
                    let a = abs(v);
                    let power = select(select(pow(a, p.p), a * a, p.p == 2.0), a, p.p == 1.0);
                    total = total + select(power, 0.0, a == 0.0);
                }
            }
        }
    }
    {{STORE}}
}
