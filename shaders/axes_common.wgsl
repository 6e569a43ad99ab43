// Helpers of the kernels over arbitrary axes (ir/ops/reduce_axes.py, axis_norms.py, scans.py).
//
// A contiguous tensor reduced (or normalised) over some axes is viewed, after merging
// neighbouring axes of the same kind and dropping size-1 axes, as at most 4 kept and 4
// reduced dimensions, each with its element stride in the input (lowering pads them with
// size 1, stride 0). `at(idx, dims, st)` is the input offset of the row-major index `idx`
// over `dims`: the offset of output element / group `o` is at(o, keep_dims, keep_st), and
// that of its r-th reduced element adds at(r, red_dims, red_st).

fn at(idx: u32, dims: vec4<u32>, st: vec4<u32>) -> u32 {
    var t = idx;
    let c3 = t % dims.w;
    t = t / dims.w;
    let c2 = t % dims.z;
    t = t / dims.z;
    let c1 = t % dims.y;
    let c0 = t / dims.y;
    return dot(vec4<u32>(c0, c1, c2, c3), st);
}

// is_nan (a NaN test on the bits: WGSL lets compilers assume floats are never NaN) comes
// from math.wgsl, which common.wgsl includes.

// IEEE infinities and a quiet NaN, built from bits (WGSL has no literals for them).
fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u);
}

fn quiet_nan() -> f32 {
    return bitcast<f32>(0x7fc00000u);
}

// max and min that return NaN when either operand is NaN, as numpy's maximum / minimum
// (WGSL leaves max(NaN, x) to the implementation).
fn max_nan(a: f32, b: f32) -> f32 {
    return select(max(a, b), quiet_nan(), is_nan(a) || is_nan(b));
}

fn min_nan(a: f32, b: f32) -> f32 {
    return select(min(a, b), quiet_nan(), is_nan(a) || is_nan(b));
}

// Natural log with numpy's results outside its domain: -inf at 0, NaN below 0.
fn log_ieee(v: f32) -> f32 {
    return select(select(quiet_nan(), neg_inf(), v == 0.0), log(v), v > 0.0);
}
