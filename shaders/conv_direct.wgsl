//#include "conv_common.wgsl"
// Conv / ConvTranspose, direct (ir/ops/conv.py, for few output channels per group: depthwise
// convolutions, 1-channel heads): one invocation per output element out[nb, o, d, h, w],
// the sum over the group's C/group input channels and the kernel taps. A tap in
// the padding reads a clamped in-bounds element and adds it times zero, so the tap loops have
// no branches; a ConvTranspose without dilation visits only the taps of its output's stride
// phase (tap_first). Per tap the group's channels are summed in the innermost loop, then
// weighted by whether the tap is real. 256 per workgroup. KD, KH, KW (conv_common.wgsl) and CG
// are template constants, so the compiler can unroll the loops (a depthwise convolution's
// channel loop is one step).

const CG: u32 = {{CG}}u;  // input channels per group (p.chan.x)

// The input coordinate of tap t along an axis, clamped inside, and 1 or 0 for whether it is real.
fn tap_weight(o: u32, t: u32, n_in: u32, s: u32, pad: i32, d: u32) -> vec2<i32> {
    let i = tap_at(o, t, n_in, s, pad, d);
    return vec2<i32>(max(i, 0), select(0, 1, i >= 0));
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let e = linear_workgroup(wid, nwg) * 256u + li;
    if (e >= p.total) {
        return;
    }
    let spatial = p.outs.x * p.outs.y * p.outs.z;
    let oc = out_coord(e % spatial);
    let o = (e / spatial) % p.outs.w;
    let nb = e / (spatial * p.outs.w);
    let grp = o / p.chan.y;
    let m = o % p.chan.y;
    let plane = p.ins.x * p.ins.y * p.ins.z;
    let step = vec3<u32>(tap_step(p.stride.x, p.dil.x), tap_step(p.stride.y, p.dil.y),
                         tap_step(p.stride.z, p.dil.z));
    let x0 = (nb * p.ins.w + grp * p.chan.x) * plane;  // channel 0 of the group
    let w_step = weight_at(grp, m, 1u, 0u) - weight_at(grp, m, 0u, 0u);  // between input channels
    var acc = 0.0;
    for (var td = tap_first(oc.x, p.stride.x, p.pad.x, p.dil.x); td < KD; td = td + step.x) {
        let id = tap_weight(oc.x, td, p.ins.x, p.stride.x, p.pad.x, p.dil.x);
        for (var th = tap_first(oc.y, p.stride.y, p.pad.y, p.dil.y); th < KH; th = th + step.y) {
            let ih = tap_weight(oc.y, th, p.ins.y, p.stride.y, p.pad.y, p.dil.y);
            let row = (u32(id.x) * p.ins.y + u32(ih.x)) * p.ins.z;
            for (var tw = tap_first(oc.z, p.stride.z, p.pad.z, p.dil.z); tw < KW; tw = tw + step.z) {
                let iw = tap_weight(oc.z, tw, p.ins.z, p.stride.z, p.pad.z, p.dil.z);
                var xi = x0 + row + u32(iw.x);
                var wi = weight_at(grp, m, 0u, (td * KH + th) * KW + tw);
                var s = 0.0;
                for (var c = 0u; c < CG; c = c + 1u) {
                    s = fma(x[xi], w[wi], s);
                    xi = xi + plane;
                    wi = wi + w_step;
                }
                acc = fma(s, f32(id.y * ih.y * iw.y), acc);
            }
        }
    }
    out[e] = conv_epilogue(o, e, acc);
}
