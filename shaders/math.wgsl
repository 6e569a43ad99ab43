// Elementary functions with f32 accuracy of a few ulp on every adapter, for the unary table
// (ir/ops/elementwise.py, ir/ops/unary.py): common.wgsl includes this file. WGSL's built-ins
// promise little (log: absolute error 2^-21 near 1; tanh, sinh, asinh, atanh: inherited from
// exp formulas that cancel near 0; asin, acos, atan: 4096 ulp; sin, cos: absolute error
// 2^-11 in [-pi, pi] only), and lavapipe's log, tanh, sinh, asinh and atanh lose every digit
// for small arguments. These use only exp, sqrt, frexp, ldexp and arithmetic, whose WGSL
// bounds are tight. The polynomials are the single-precision minimax fits of S. L. Moshier's
// Cephes Math Library (1984-2000; sinf.c, tanf.c, asinf.c, atanf.c, logf.c, expf.c, sinhf.c,
// tanhf.c, asinhf.c, acoshf.c, atanhf.c, erff.c), with Cephes' range reductions; the error
// each reaches on lavapipe is measured in tests/gpu/test_ops_unary.py (precision rows).

// WGSL lets a compiler assume that no value is infinite or NaN, so special values are made
// and recognised through their bits, never by a comparison.
const BITS_INF: u32 = 0x7f800000u;
const BITS_NAN: u32 = 0x7fc00000u;
const PI_2: f32 = 1.5707963267948966;

fn inf_f32() -> f32 {
    return bitcast<f32>(BITS_INF);
}

fn nan_f32() -> f32 {
    return bitcast<f32>(BITS_NAN);
}

fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > BITS_INF;
}

// +-inf with the sign of s.
fn signed_inf(s: f32) -> f32 {
    return bitcast<f32>(BITS_INF | (bitcast<u32>(s) & 0x80000000u));
}

// x rounded to the nearest binary16 value, ties to even (IEEE 754's default rounding, as numpy's
// astype(float16)), kept in f32: a multiple of its binade's quantum 2^(e - 10) (2^-24 below
// 2^-14, the subnormals), +-inf from 65520 (halfway past 65504, the largest half) up; NaN stays.
fn round_f16(x: f32) -> f32 {
    let bits = bitcast<u32>(x) & 0x7fffffffu;
    if (bits > BITS_INF) {
        return x;
    }
    if (bits >= 0x477ff000u) {
        return signed_inf(x);
    }
    let q = ldexp(1.0, max(i32(bits >> 23u) - 127, -14) - 10);
    let r = round(bitcast<f32>(bits) / q) * q;
    return bitcast<f32>(bitcast<u32>(r) | (bitcast<u32>(x) & 0x80000000u));
}

// x rounded to the nearest bfloat16 value (an f32's upper 16 bits), ties to even; NaN stays.
fn round_bf16(x: f32) -> f32 {
    let u = bitcast<u32>(x);
    if ((u & 0x7fffffffu) > BITS_INF) {
        return x;
    }
    return bitcast<f32>((u + 0x7fffu + ((u >> 16u) & 1u)) & 0xffff0000u);
}

// exp(x): x = k ln2 + r with ln2 in two parts (Cody-Waite, k ln2_hi exact), |r| <= ln2 / 2,
// exp(r) by Cephes expf's polynomial, and 2^k applied in two halves (no overflow of 2^k).
// +inf above 88.72 (where the f32 result overflows), 0 below -103.9; NaN stays NaN.
fn exp_acc(x: f32) -> f32 {
    let xc = clamp(x, -104.0, 89.0);
    let k = round(xc * 1.4426950408889634);
    let r = (xc - k * 0.693359375) + k * 2.12194440e-4;
    let z = r * r;
    let p = ((((((1.9875691500e-4 * r + 1.3981999507e-3) * r + 8.3334519073e-3) * r + 4.1665795894e-2) * r
        + 1.6666665459e-1) * r + 5.0000001201e-1) * z + r) + 1.0;
    let ki = i32(k);
    let y = ldexp(ldexp(p, ki / 2), ki - ki / 2);
    return select(select(y, inf_f32(), x > 88.72283935546875), x, is_nan(x));
}

// exp(x) - 1 without the cancellation near 0: the Taylor series to x^8 / 8! for |x| < 0.35
// (relative error below 3e-9), exp_acc(x) - 1 beyond.
fn expm1_acc(x: f32) -> f32 {
    let s = x * (1.0 + x * (0.5 + x * (1.6666666666666667e-1 + x * (4.1666666666666664e-2 + x * (8.3333333333333332e-3
        + x * (1.3888888888888889e-3 + x * (1.9841269841269841e-4 + x * 2.4801587301587302e-5)))))));
    return select(exp_acc(x) - 1.0, s, abs(x) < 0.35);
}

// log(1 + m) for m in [sqrt(1/2) - 1, sqrt(2) - 1]: Cephes logf's polynomial.
fn log1p_kernel(m: f32) -> f32 {
    let z = m * m;
    let y = ((((((((7.0376836292e-2 * m - 1.1514610310e-1) * m + 1.1676998740e-1) * m - 1.2420140846e-1) * m
        + 1.4249322787e-1) * m - 1.6668057665e-1) * m + 2.0000714765e-1) * m - 2.4999993993e-1) * m
        + 3.3333331174e-1) * m * z;
    return m + (y - 0.5 * z);
}

// log(x) for x > 0 and finite: x = 2^e f, f in [sqrt(1/2), sqrt(2)), e ln2 in two parts.
fn log_pos(x: f32) -> f32 {
    let fr = frexp(x);
    let lo = fr.fract < 0.70710678118654752;
    let f = select(fr.fract, 2.0 * fr.fract, lo);
    let e = f32(select(fr.exp, fr.exp - 1, lo));
    return (log1p_kernel(f - 1.0) - e * 2.12194440e-4) + e * 0.693359375;
}

// IEEE log: -inf at +-0, NaN below 0 and for NaN, +inf at +inf.
fn log_acc(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    let special = select(select(BITS_NAN, 0xff800000u, (b & 0x7fffffffu) == 0u), BITS_INF, b == BITS_INF);
    return select(bitcast<f32>(special), log_pos(x), b != 0u && b < BITS_INF);
}

// log(1 + x): the kernel itself where 1 + x lies in [sqrt(1/2), sqrt(2)), log_acc(1 + x) beyond.
fn log1p_acc(x: f32) -> f32 {
    return select(log_acc(1.0 + x), log1p_kernel(x), x > -0.29289321881345248 && x < 0.41421356237309505);
}

// sin(r), cos(r) for |r| <= pi/4: Cephes sinf's polynomials.
fn sin_kernel(r: f32) -> f32 {
    let z = r * r;
    return ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * r + r;
}

fn cos_kernel(r: f32) -> f32 {
    let z = r * r;
    return ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z - 0.5 * z + 1.0;
}

// x = k pi/2 + r with |r| <= pi/4: what sin, cos and tan reduce their argument to.
struct Reduced {
    r: f32,
    q: u32,  // k mod 4
}

// Cody-Waite for |x| < 512 (|k| < 2^9): pi/2 in four parts, the first three of 8, 11 and 15
// significant bits, so that k times each is exact and the subtractions cancel exactly.
fn reduce_pi_2_small(x: f32) -> Reduced {
    let k = round(x * 0.63661977236758134);
    let r = (((x - k * 1.5703125) - k * 4.837512969970703125e-4) - k * 7.549897418357432e-8) + k * 1.074634630414406e-12;
    return Reduced(r, u32(i32(k) & 3));
}

// The 64-bit product (lo, hi) of two u32s, from 16-bit halves (WGSL has no 64-bit integers).
fn mul_u32_wide(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return vec2<u32>((p00 & 0xffffu) | (mid << 16u), a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}

// Payne-Hanek for |x| >= 512 (M. H. Payne and R. N. Hanek, "Radian reduction for trigonometric
// functions", SIGNUM Newsletter 18, 1983): |x| = m 2^s with m the 24-bit significand, and
// x 2/pi mod 4 = m W / 2^94 mod 4, W the 96 bits of 2/pi from the one worth 2^(1-s) on (the
// bits above it add multiples of 4). The 128-bit product keeps the quadrant in bits 95..94
// and 62 bits of fraction below, so r keeps its f32 precision for every finite x.
fn reduce_pi_2_large(x: f32) -> Reduced {
    // a zero word, then the bits of 2/pi
    var t = array<u32, 8>(0u, 0xa2f9836eu, 0x4e441529u, 0xfc2757d1u, 0xf534ddc0u, 0xdb629599u, 0x3c439041u,
                          0xfe5163abu);
    let b = bitcast<u32>(x);
    let m = (b & 0x7fffffu) | 0x800000u;
    let i = min((b >> 23u) & 0xffu, 254u) - 120u;  // bit s - 1 of 2/pi is bit s + 30 of t (s >= -14 here)
    let j = i / 32u;
    let o = i % 32u;
    let w0 = select((t[j] << o) | (t[j + 1u] >> (32u - o)), t[j], o == 0u);
    let w1 = select((t[j + 1u] << o) | (t[j + 2u] >> (32u - o)), t[j + 1u], o == 0u);
    let w2 = select((t[j + 2u] << o) | (t[j + 3u] >> (32u - o)), t[j + 2u], o == 0u);
    let p0 = mul_u32_wide(m, w0);
    let p1 = mul_u32_wide(m, w1);
    let p2 = mul_u32_wide(m, w2);
    let word1 = p2.y + p1.x;
    let word2 = p1.y + p0.x + select(0u, 1u, word1 < p2.y);  // bits 95..64 of the product
    var q = word2 >> 30u;
    var hi = word2 & 0x3fffffffu;  // the fraction: hi 2^-30 + word1 2^-62
    var lo = word1;
    var sign = 1.0;
    if ((hi & 0x20000000u) != 0u) {  // fraction >= 1/2: the next quadrant, fraction - 1
        q = q + 1u;
        sign = -1.0;
        lo = ~word1 + 1u;
        hi = (~hi & 0x3fffffffu) + select(0u, 1u, word1 == 0u);
    }
    let f = f32(hi) * 9.313225746154785e-10 + f32(lo) * 2.168404344971009e-19;
    let r = sign * f * PI_2;
    let neg = x < 0.0;
    return Reduced(select(r, -r, neg), select(q, 4u - q, neg) & 3u);
}

fn reduce_pi_2(x: f32) -> Reduced {
    if (abs(x) < 512.0) {
        return reduce_pi_2_small(x);
    }
    return reduce_pi_2_large(x);
}

// NaN for +-inf and NaN, v otherwise.
fn nan_unless_finite(x: f32, v: f32) -> f32 {
    return select(v, nan_f32(), (bitcast<u32>(x) & BITS_INF) == BITS_INF);
}

fn sin_acc(x: f32) -> f32 {
    let t = reduce_pi_2(x);
    let v = select(sin_kernel(t.r), cos_kernel(t.r), (t.q & 1u) == 1u);
    return nan_unless_finite(x, select(v, -v, t.q >= 2u));
}

fn cos_acc(x: f32) -> f32 {
    let t = reduce_pi_2(x);
    let v = select(cos_kernel(t.r), sin_kernel(t.r), (t.q & 1u) == 1u);
    return nan_unless_finite(x, select(v, -v, t.q == 1u || t.q == 2u));
}

// tan(r) for |r| <= pi/4: Cephes tanf's polynomial; tan(x) = tan(r), or -1 / tan(r) for odd k.
fn tan_acc(x: f32) -> f32 {
    let t = reduce_pi_2(x);
    let z = t.r * t.r;
    let y = (((((9.38540185543e-3 * z + 3.11992232697e-3) * z + 2.44301354525e-2) * z + 5.34112807005e-2) * z
        + 1.33387994085e-1) * z + 3.33331568548e-1) * z * t.r + t.r;
    return nan_unless_finite(x, select(y, -1.0 / y, (t.q & 1u) == 1u));
}

// asin on [0, 1/2] of its argument a (Cephes asinf's polynomial in z = a^2).
fn asin_kernel(a: f32, z: f32) -> f32 {
    return ((((4.2163199048e-2 * z + 2.4181311049e-2) * z + 4.5470025998e-2) * z + 7.4953002686e-2) * z
        + 1.6666752422e-1) * z * a + a;
}

// asin(x) = pi/2 - 2 asin(sqrt((1 - |x|) / 2)) for |x| > 1/2; NaN outside [-1, 1].
fn asin_acc(x: f32) -> f32 {
    let a = abs(x);
    let z = 0.5 * (1.0 - a);
    let s = sqrt(z);
    let v = select(asin_kernel(a, a * a), PI_2 - 2.0 * asin_kernel(s, z), a > 0.5);
    return select(nan_f32(), select(-v, v, x >= 0.0), a <= 1.0);
}

// acos(x) = pi/2 - asin(x) for |x| <= 1/2, 2 asin(sqrt((1 - x) / 2)) for x > 1/2 and
// pi - 2 asin(sqrt((1 + x) / 2)) for x < -1/2 (Cephes acosf).
fn acos_acc(x: f32) -> f32 {
    let a = abs(x);
    let z = 0.5 * (1.0 - a);
    let t = 2.0 * asin_kernel(sqrt(z), z);
    let v = select(PI_2 - select(-1.0, 1.0, x >= 0.0) * asin_kernel(a, a * a), select(3.14159265358979 - t, t, x > 0.0),
                   a > 0.5);
    return select(nan_f32(), v, a <= 1.0);
}

// atan: |x| > tan(3pi/8) -> pi/2 + atan(-1/|x|), |x| > tan(pi/8) -> pi/4 + atan((|x| - 1) / (|x| + 1)),
// then Cephes atanf's polynomial.
fn atan_acc(x: f32) -> f32 {
    let a = abs(x);
    let big = a > 2.414213562373095;
    let mid = a > 0.4142135623730950;
    let y0 = select(select(0.0, 0.78539816339744831, mid), PI_2, big);
    let t = select(select(a, (a - 1.0) / (a + 1.0), mid), -1.0 / a, big);
    let z = t * t;
    let v = y0 + ((((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1) * z * t
        + t);
    return select(-v, v, x >= 0.0);
}

// e^a / 2 for a >= 0 without overflow below the f32 limit (a up to 89.4): (e^(a/2) / 2) e^(a/2).
fn half_exp(a: f32) -> f32 {
    let h = exp_acc(0.5 * a);
    return select(0.5 * exp_acc(a), (0.5 * h) * h, a > 88.0);
}

// sinh: Cephes sinhf's polynomial for |x| <= 1, (e - 1/e) / 2 beyond.
fn sinh_acc(x: f32) -> f32 {
    let a = abs(x);
    let z = x * x;
    let small = ((2.03721912945e-4 * z + 8.33028376239e-3) * z + 1.66667160211e-1) * z * x + x;
    let h = half_exp(a);
    let big = h - 0.25 / h;
    return select(select(-big, big, x >= 0.0), small, a <= 1.0);
}

fn cosh_acc(x: f32) -> f32 {
    let h = half_exp(abs(x));
    return h + 0.25 / h;
}

// tanh: Cephes tanhf's polynomial for |x| < 0.625, 1 - 2 / (e^(2|x|) + 1) beyond (1 from |x| > 9.1);
// NaN stays NaN.
fn tanh_acc(x: f32) -> f32 {
    let a = abs(x);
    let z = x * x;
    let small = ((((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z + 1.33314422036e-1) * z
        - 3.33332819422e-1) * z * x + x;
    let big = 1.0 - 2.0 / (exp_acc(2.0 * min(a, 10.0)) + 1.0);
    return select(select(select(-big, big, x >= 0.0), small, a < 0.625), x, is_nan(x));
}

// asinh: Cephes asinhf's polynomial for |x| < 1/2, log(|x| + sqrt(x^2 + 1)) up to 1500 and
// log(|x|) + ln 2 beyond (x^2 would overflow).
fn asinh_acc(x: f32) -> f32 {
    let a = abs(x);
    let z = x * x;
    let small = (((2.0122003309e-2 * z - 4.2699340972e-2) * z + 7.4847586088e-2) * z - 1.6666288134e-1) * z * a + a;
    let mid = log_acc(a + sqrt(z + 1.0));
    let v = select(select(mid, log_acc(a) + 0.69314718055994531, a > 1500.0), small, a < 0.5);
    return select(-v, v, x >= 0.0);
}

// acosh: Cephes acoshf's polynomial in z = x - 1 (times sqrt(z)) for z < 1/2,
// log(x + sqrt(z (x + 1))) up to 1500 and log(x) + ln 2 beyond; NaN below 1.
fn acosh_acc(x: f32) -> f32 {
    let z = x - 1.0;
    let small = ((((1.7596881071e-3 * z - 7.5272886713e-3) * z + 2.6454905019e-2) * z - 1.1784741703e-1) * z
        + 1.4142135263) * sqrt(max(z, 0.0));
    let mid = log_acc(x + sqrt(z * (x + 1.0)));
    let v = select(select(mid, log_acc(x) + 0.69314718055994531, x > 1500.0), small, z < 0.5);
    return select(nan_f32(), v, x >= 1.0);
}

// atanh: Cephes atanhf's polynomial for |x| < 1/2, log((1 + x) / (1 - x)) / 2 beyond;
// +-inf at +-1, NaN outside [-1, 1].
fn atanh_acc(x: f32) -> f32 {
    let a = abs(x);
    let z = x * x;
    let small = ((((1.81740078349e-1 * z + 8.24370301058e-2) * z + 1.46691431730e-1) * z + 1.99782164500e-1) * z
        + 3.33337300303e-1) * z * x + x;
    let big = select(0.5 * log_acc((1.0 + x) / (1.0 - x)), signed_inf(x), a == 1.0);
    return select(nan_f32(), select(big, small, a < 0.5), a <= 1.0);
}

// erf: Cephes erff's polynomial for |x| < 1, 1 - erfc(|x|) beyond (erfc_pos of common.wgsl,
// relative error below 1.2e-7, so below half an ulp of erf there); NaN stays NaN.
fn erf_acc(x: f32) -> f32 {
    let a = abs(x);
    let z = x * x;
    let small = x * ((((((7.853861353153693e-5 * z - 8.010193625184903e-4) * z + 5.188327685732524e-3) * z
        - 2.685381193529856e-2) * z + 1.128358514861418e-1) * z - 3.761262582423300e-1) * z + 1.128379165726710);
    let ac = min(a, 10.0);
    let big = 1.0 - erfc_pos(ac, ac * ac);
    return select(select(select(-big, big, x >= 0.0), small, a < 1.0), x, is_nan(x));
}
