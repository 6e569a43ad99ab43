// Helpers shared by every kernel: `//#include "common.wgsl"` pulls this file in at lowering.
// Sources of the formulas are given per function; the op specs of ir/ops/ hold the reference semantics.

// Finite score for a masked attention key (ir/ops/attention.py MASK_SENTINEL); no infinities anywhere.
const MASK_SENTINEL: f32 = -1.0e30;
// Below every finite score we compute; the start value of running maxima.
const MAX_INIT: f32 = -3.0e38;

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

// tanh with the argument clamped so exp-based implementations cannot overflow
// (tanh(10) rounds to 1 in f32).
fn tanh_clamped(x: f32) -> f32 {
    return tanh(clamp(x, -10.0, 10.0));
}

fn silu(x: f32) -> f32 {
    return x * sigmoid(x);
}

// softplus(x) = log(1 + exp(x)) = max(x, 0) + log1p(e), e = exp(-|x|) (exp never overflows);
// WGSL has no log1p: below 1e-3 its series e - e^2/2 + e^3/3 (relative error < 3e-10).
fn softplus(x: f32) -> f32 {
    let e = exp(-abs(x));
    let l = select(log(1.0 + e), e * (1.0 - e * (0.5 - e / 3.0)), e < 1e-3);
    return max(x, 0.0) + l;
}

// erfc(z) for z >= 0, Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7).
fn erfc_pos(z: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.3275911 * z);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741
        + t * (-1.453152027 + t * 1.061405429))));
    return poly * exp(-z * z);
}

// GELU, erf form: 0.5 x (1 + erf(x / sqrt 2)) (Hendrycks & Gimpel 2016). For x < 0 the
// bracket equals erfc(|x| / sqrt 2), computed directly so no cancellation occurs.
fn gelu_erf(x: f32) -> f32 {
    let c = erfc_pos(abs(x) * 0.7071067811865476);
    return 0.5 * x * select(c, 2.0 - c, x >= 0.0);
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
