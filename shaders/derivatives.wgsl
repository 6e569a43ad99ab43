//#include "common.wgsl"
// Derivatives f'(x) of the unary ops for the gradient kernels (the unary table
// of ir/ops/elementwise.py holds the float64 references and the sources of the formulas). Each is
// written so that nothing overflows or cancels for large |x|: the logistic's s (1 - s) is
// e / (1 + e)^2 with e = exp(-|x|), never 1 - s.

// sigmoid'(x) = s (1 - s) = e / (1 + e)^2, e = exp(-|x|).
fn dsigmoid(x: f32) -> f32 {
    let e = exp(-abs(x));
    let d = 1.0 + e;
    return e / (d * d);
}

// tanh'(x) = 1 - tanh(x)^2 = 4 sigmoid'(2x), without the cancellation of 1 - t^2.
fn dtanh(x: f32) -> f32 {
    return 4.0 * dsigmoid(2.0 * x);
}

// silu'(x) = s (1 + x (1 - s)), s = sigmoid(x), with 1 - s computed as sigmoid(-x).
fn dsilu(x: f32) -> f32 {
    return sigmoid(x) * (1.0 + x * sigmoid(-x));
}

// GELU (erf form)' = Phi(x) + x phi(x), Phi/phi the standard normal cdf/pdf
// (Hendrycks & Gimpel 2016); Phi from normal_cdf as gelu_erf computes it.
fn dgelu_erf(x: f32) -> f32 {
    return normal_cdf(x) + x * 0.3989422804014327 * exp(-0.5 * x * x);
}

// GELU (tanh form)' with v = 2u = k (x + 0.044715 x^3), k = 2 sqrt(2/pi):
// 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u' = sigmoid(v) + x sigmoid'(v) k (1 + 3 * 0.044715 x^2).
// The second term is below f32's smallest normal for |x| > 15; x is clamped there so that
// x^3 cannot overflow into 0 * inf.
fn dgelu_tanh(x: f32) -> f32 {
    let k = 1.5957691216057308;
    let xc = clamp(x, -15.0, 15.0);
    let v = k * (xc + 0.044715 * xc * xc * xc);
    return sigmoid(k * (x + 0.044715 * x * x * x)) + xc * dsigmoid(v) * k * (1.0 + 0.134145 * xc * xc);
}

// tan'(x) = 1 / cos(x)^2.
fn dtan(x: f32) -> f32 {
    let c = cos_acc(x);
    return 1.0 / (c * c);
}

// mish'(x) = tanh(sp) + x (1 - tanh(sp)^2) sigmoid(x), sp = softplus(x), with n = exp(x) and
// t = n (n + 2): tanh(sp) = t / (t + 2), 1 - tanh(sp)^2 = 4 (t + 1) / (t + 2)^2 (Misra 2019).
// 1 from x = 20 on, where the second term is below 2^-24.
fn dmish(x: f32) -> f32 {
    let n = exp_acc(min(x, 20.0));
    let t = n * (n + 2.0);
    let d = t + 2.0;
    return select(t / d + x * 4.0 * (t + 1.0) / (d * d) * (n / (1.0 + n)), 1.0, x >= 20.0);
}
