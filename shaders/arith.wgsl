// Helpers of the broadcasting ops of ir/ops/arithmetic.py, pulled into broadcast.wgsl by the
// rows whose expressions call them. IEEE special values are told apart by their bits: WGSL lets
// an implementation assume that floats are finite (https://www.w3.org/TR/WGSL/#floating-point-evaluation),
// and a NaN or infinity is built at run time from `bits` (a const-expression may not be one).

// is_nan comes from math.wgsl (included by common.wgsl, which broadcast.wgsl includes).

fn is_inf(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u;
}

// A quiet NaN (bits 0x7fc00000) or +infinity (0x7f800000), from a value known only at run time.
fn special(nan: bool) -> f32 {
    return bitcast<f32>(select(0x7f800000u, 0x7fc00000u, nan));
}

// |mag| with the sign bit of s (C copysign).
fn copy_sign(mag: f32, s: f32) -> f32 {
    return bitcast<f32>((bitcast<u32>(mag) & 0x7fffffffu) | (bitcast<u32>(s) & 0x80000000u));
}

// numpy minimum / maximum: NaN when either operand is NaN.
fn min_f32(a: f32, b: f32) -> f32 {
    let nan = is_nan(a) || is_nan(b);
    return select(min(a, b), special(nan), nan);
}

fn max_f32(a: f32, b: f32) -> f32 {
    let nan = is_nan(a) || is_nan(b);
    return select(max(a, b), special(nan), nan);
}

const I32_MIN: i32 = -2147483647 - 1;

// Integer division truncating toward zero (C; ONNX Div); a / 0 = a and I32_MIN / -1 = I32_MIN,
// the values WGSL gives them (https://www.w3.org/TR/WGSL/#arithmetic-expr).
fn div_i32(a: i32, b: i32) -> i32 {
    return a / select(b, 1, b == 0 || (a == I32_MIN && b == -1));
}

// Remainder with the dividend's sign (C %, numpy fmod); 0 for b = 0 (numpy's value).
fn fmod_i32(a: i32, b: i32) -> i32 {
    return a % select(b, 1, b == 0 || b == -1);
}

// Remainder with the divisor's sign (Python %, numpy mod); 0 for b = 0.
fn mod_i32(a: i32, b: i32) -> i32 {
    let r = fmod_i32(a, b);
    return select(r, r + b, r != 0 && ((r < 0) != (b < 0)));
}

// C fmod: the exact remainder of a / b with the dividend's sign (numpy fmod); NaN for b = 0 or
// an infinite a, a for |a| < |b| (an infinite b too). Computed on the significands as integers,
// a long division 8 bits of the exponent difference at a time (as musl's fmodf does it bit by
// bit), since a compiler may reassociate float arithmetic (an error-free product would not
// survive it).
fn fmod_f32(a: f32, b: f32) -> f32 {
    let nan = is_nan(a) || is_nan(b) || is_inf(a) || b == 0.0;
    let ua = bitcast<u32>(a) & 0x7fffffffu;
    let ub = bitcast<u32>(b) & 0x7fffffffu;
    // |a| = ma 2^(ea - 150), |b| = mb 2^(eb - 150), a subnormal taking exponent 1 without the hidden bit
    let ea = max(i32(ua >> 23u), 1);
    let eb = max(i32(ub >> 23u), 1);
    let ma = select((ua & 0x7fffffu) | 0x800000u, ua & 0x7fffffu, ua < 0x800000u);
    let mb = select((ub & 0x7fffffu) | 0x800000u, ub & 0x7fffffu, ub < 0x800000u);
    var m = ma % max(mb, 1u);
    var d = ea - eb;
    while (d > 0) {
        let k = u32(min(d, 8));
        m = (m << k) % mb;
        d = d - i32(k);
    }
    let r = select(copy_sign(ldexp(f32(m), eb - 150), a), a, ua < ub);
    return select(r, special(nan), nan);
}

// Python float %, numpy mod: the remainder with the divisor's sign (a zero one too).
fn mod_f32(a: f32, b: f32) -> f32 {
    var r = fmod_f32(a, b);
    r = select(r, r + b, r != 0.0 && (r < 0.0) != (b < 0.0));
    return select(r, copy_sign(0.0, b), r == 0.0);
}

// x^n by square and multiply in f32 (a rounding per product: at most 11 for n <= 64).
fn powi_f32(x: f32, n: u32) -> f32 {
    var r = 1.0;
    var b = x;
    var e = n;
    while (e != 0u) {
        if ((e & 1u) != 0u) {
            r = r * b;
        }
        b = b * b;
        e = e >> 1u;
    }
    return r;
}

// C pow / numpy power (C99 Annex F.9.4.4): 1 for y = 0 or x = 1 (NaN operands too); NaN for a
// finite x < 0 and a non-integer y; odd integer powers keep the sign of x (zeros and infinities
// too). Otherwise |x|^y: by square and multiply for an integer |y| <= 64 (1 / |x|^-y for y < 0)
// where that neither overflows nor underflows, else WGSL's pow, exp2(y log2 |x|), whose relative
// error grows with |y log2 |x||.
fn pow_f32(x: f32, y: f32) -> f32 {
    let ax = abs(x);
    let integer = floor(y) == y;  // the infinities count as even integers
    let odd = integer && floor(y * 0.5) != y * 0.5;
    var r = pow(ax, y);
    if (integer && abs(y) <= 64.0) {
        let m = powi_f32(ax, u32(abs(y)));
        let finite = m != 0.0 && (bitcast<u32>(m) & 0x7f800000u) != 0x7f800000u;
        r = select(r, select(m, 1.0 / m, y < 0.0), finite);
    }
    r = select(r, select(special(false), 0.0, y > 0.0), ax == 0.0);  // |x| = 0: 0 or +inf
    r = select(r, select(0.0, special(false), y > 0.0), is_inf(x));
    r = select(r, select(select(0.0, special(false), (ax > 1.0) == (y > 0.0)), 1.0, ax == 1.0), is_inf(y));
    r = select(r, -r, odd && (x < 0.0 || (ax == 0.0 && bitcast<u32>(x) != 0u)));
    let nan = is_nan(x) || is_nan(y) || (x < 0.0 && !integer && !is_inf(x));
    r = select(r, special(true), nan);
    return select(r, 1.0, y == 0.0 || x == 1.0);
}

// x^n with wrapping 32-bit products (square and multiply); for n < 0 the truncated 1 / x^-n:
// 1 for x = 1, +-1 for x = -1, else 0.
fn pow_i32(x: i32, n: i32) -> i32 {
    if (n < 0) {
        return select(select(0, select(1, -1, (n & 1) != 0), x == -1), 1, x == 1);
    }
    var r = 1;
    var b = x;
    var e = n;
    while (e != 0) {
        if ((e & 1) != 0) {
            r = r * b;
        }
        b = b * b;
        e = e >> 1u;
    }
    return r;
}

// f32 -> i32 truncating toward zero, saturating at the i32 range; NaN -> 0.
fn f32_to_i32(v: f32) -> i32 {
    return select(i32(clamp(v, -2147483648.0, 2147483520.0)), 0, is_nan(v));
}

// Pow(i32, f32): an integral exponent by pow_i32 (exact, wrapping), another through pow_f32.
fn pow_i32_f32(x: i32, y: f32) -> i32 {
    let integral = floor(y) == y && abs(y) < 2147483648.0;
    return select(f32_to_i32(pow_f32(f32(x), y)), pow_i32(x, i32(y)), integral);
}

// -1, 0 or 1 (numpy sign); NaN stays NaN.
fn sign_f32(v: f32) -> f32 {
    return select(select(select(0.0, 1.0, v > 0.0), -1.0, v < 0.0), v, is_nan(v));
}

// ONNX BitShift on i32: out-of-range amounts (< 0 or >= 32) give 0, or for RIGHT -1 on a
// negative value; LEFT shifts the bits (onnx/reference/ops/op_bitshift.py).
fn shl_i32(a: i32, b: i32) -> i32 {
    return select(0, bitcast<i32>(bitcast<u32>(a) << u32(b & 31)), b >= 0 && b < 32);
}

fn shr_i32(a: i32, b: i32) -> i32 {
    return select(select(0, -1, a < 0), a >> u32(b & 31), b >= 0 && b < 32);
}
