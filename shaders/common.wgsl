// Helpers shared by every kernel: `//#include "common.wgsl"` pulls this file in at lowering.
// Sources of the formulas are given per function; the op specs of ir/ops/ hold the reference semantics.
//#include "math.wgsl"

// Finite score for a masked attention key (ir/ops/attention.py MASK_SENTINEL); no infinities anywhere.
const MASK_SENTINEL: f32 = -1.0e30;
// The lowest finite f32 (-FLT_MAX): the start value of running maxima, at or below every finite value, so
// a row of float32's min (an exporter's masked scores) has that maximum (at -3.0e38 its exp(x - max)
// were all 0: a softmax of NaN).
const MAX_INIT: f32 = -3.4028234663852886e38;

// Logical (linear) workgroup index of a dispatch the lowering may have split over a
// 2-D or 3-D grid to stay under maxComputeWorkgroupsPerDimension.
fn linear_workgroup(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + nwg.x * (wid.y + nwg.y * wid.z);
}

// Logistic function without overflow: exp only ever sees -|x|.
fn sigmoid(x: f32) -> f32 {
    let e = exp(-abs(x));
    let s = 1.0 / (1.0 + e);
    return select(e * s, s, x >= 0.0);
}

// clamp(x, lo, hi) that keeps a NaN, as numpy's clip does (WGSL's clamp, min and max need not).
fn clamp_nan(x: f32, lo: f32, hi: f32) -> f32 {
    return select(select(x, hi, x > hi), lo, x < lo);
}

// tanh with the argument clamped so exp-based implementations cannot overflow
// (tanh(10) rounds to 1 in f32).
fn tanh_clamped(x: f32) -> f32 {
    return tanh(clamp_nan(x, -10.0, 10.0));
}

fn silu(x: f32) -> f32 {
    return x * sigmoid(x);
}

// softplus(x) = log(1 + exp(x)) = max(x, 0) + log1p(e), e = exp(-|x|) (exp never overflows),
// log1p_acc (math.wgsl) keeping its relative accuracy for small e.
fn softplus(x: f32) -> f32 {
    return max(x, 0.0) + log1p_acc(exp(-abs(x)));
}

// mish(x) = x tanh(softplus(x)) (Misra 2019) = x n (n + 2) / (n (n + 2) + 2), n = exp(x): no
// cancellation for x < 0, and x itself from x = 20 on (the ratio rounds to 1 there).
fn mish(x: f32) -> f32 {
    let n = exp_acc(min(x, 20.0));
    let t = n * (n + 2.0);
    return select(x * t / (t + 2.0), x, x >= 20.0);
}

// erfc(z) for z >= 0 with relative error below 1.2e-7 everywhere (in exact arithmetic):
// the Chebyshev fit of W. H. Press et al., Numerical Recipes in C, 2nd ed. (1992),
// section 6.2, function erfcc. The caller passes zz = z * z (x * x / 2 for z = |x| / sqrt 2:
// one rounding fewer); exp sees -zz - 1.27 plus a bounded polynomial, so the result keeps
// its relative accuracy down to f32's smallest normal (z near 9.3, |x| near 13.2).
fn erfc_pos(z: f32, zz: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = 1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (0.27886807
        + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))));
    return t * exp(-zz - 1.26551223 + t * p);
}

// The standard normal cdf Phi(x) = erfc(-x / sqrt 2) / 2, accurate relative to its value in
// the lower tail: erfc(|x| / sqrt 2) directly for x < 0, 1 minus that small tail for x >= 0.
fn normal_cdf(x: f32) -> f32 {
    let c = 0.5 * erfc_pos(abs(x) * 0.7071067811865476, 0.5 * x * x);
    return select(c, 1.0 - c, x >= 0.0);
}

// GELU, erf form: x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (Hendrycks & Gimpel 2016), with
// Phi from normal_cdf, so the negative tail keeps its relative precision (no 1 + erf).
fn gelu_erf(x: f32) -> f32 {
    return x * normal_cdf(x);
}

// GELU, tanh form: 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3).
fn gelu_tanh(x: f32) -> f32 {
    return x * sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x));
}

// Reduction of a RoPE angle to [-pi, pi] before cos/sin, Cody-Waite style (2 pi = C1 + C2,
// C1 exact in 8 bits so k * C1 is exact for k < 2^16).
fn reduce_angle(a: f32) -> f32 {
    let k = round(a * 0.15915494309189535);
    return (a - k * 6.28125) - k * 0.0019353071795864769;
}
