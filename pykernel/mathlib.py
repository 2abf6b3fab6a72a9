"""Accurate f32 math written in pykernel itself (PTX has no exp/log/erf/tanh/sin/cos beyond
`.approx` forms, and we use no libdevice). Every function is a @pk.func, so it compiles the same
for the GPU and the CPU target. Accuracy, measured against float64 numpy over wide random
ranges (tests/kernels/test_math.py): exp, exp2, log, log2 <= 2 ulp; tanh, erf <= 3 ulp;
sin, cos <= 2 ulp for |x| < 1e4 (the reduction loses accuracy beyond ~1e5)."""
from __future__ import annotations

from .intrinsics.basic_math import floor, fma
from .intrinsics.core import bitcast
from .kernel import func
from .types import f32, i32, u32

LN2_HI = 0.693145751953125
LN2_LO = 1.428606765330187e-06
LOG2E = 1.4426950408889634
INV_LN2 = 1.4426950408889634


@func
def ldexp2(p: f32, k: i32) -> f32:
    """p * 2**k for k in [-252, 254] without overflow in the intermediate power."""
    if k > 127:
        p = p * bitcast(u32(254) << 23, f32)
        k = k - 127
    if k < -126:
        p = p * bitcast(u32(1) << 23, f32)      # 2**-126
        k = k + 126
        if k < -126:
            p = p * bitcast(u32(1) << 23, f32)
            k = k + 126
    return p * bitcast(u32(k + 127) << 23, f32)


@func
def exp_poly(r: f32) -> f32:
    """e**r for |r| <= 0.35: Taylor series to r**8 (truncation < 2e-9)."""
    p = fma(r, f32(1.0 / 40320.0), f32(1.0 / 5040.0))
    p = fma(p, r, f32(1.0 / 720.0))
    p = fma(p, r, f32(1.0 / 120.0))
    p = fma(p, r, f32(1.0 / 24.0))
    p = fma(p, r, f32(1.0 / 6.0))
    p = fma(p, r, f32(0.5))
    p = fma(p, r, f32(1.0))
    return fma(p, r, f32(1.0))


@func
def exp(x: f32) -> f32:
    if x != x:
        return x
    if x > 88.72284:
        return f32(1.0) / f32(0.0)
    if x < -103.97208:
        return f32(0.0)
    k = floor(fma(x, f32(INV_LN2), f32(0.5)))
    r = fma(-k, f32(LN2_HI), x)
    r = fma(-k, f32(LN2_LO), r)
    return ldexp2(exp_poly(r), i32(k))


@func
def exp2(x: f32) -> f32:
    if x != x:
        return x
    if x >= 128.0:
        return f32(1.0) / f32(0.0)
    if x < -150.0:
        return f32(0.0)
    k = floor(x + 0.5)
    r = (x - k) * f32(0.6931471805599453)    # x - k is exact
    rr = fma(x - k, f32(0.6931471805599453), -r)  # the product's rounding error
    return ldexp2(exp_poly(r) * (f32(1.0) + rr), i32(k))


@func
def log_parts(x: f32):
    """x = m * 2**e with m in [sqrt(1/2), sqrt(2)); returns (log(m), e) for finite x > 0."""
    e = i32(0)
    if x < 1.1754944e-38:                      # subnormal: scale into the normal range
        x = x * f32(8388608.0)
        e = -23
    bits = bitcast(x, u32)
    e = e + i32((bits >> 23) & u32(255)) - 127
    m = bitcast((bits & u32(0x7FFFFF)) | u32(0x3F800000), f32)
    if m > 1.4142135:
        m = m * 0.5
        e = e + 1
    f = m - 1.0
    s = f / (f32(2.0) + f)
    z = s * s
    p = fma(z, f32(2.0 / 11.0), f32(2.0 / 9.0))
    p = fma(p, z, f32(2.0 / 7.0))
    p = fma(p, z, f32(2.0 / 5.0))
    p = fma(p, z, f32(2.0 / 3.0))
    # log(m) = 2s + s*z*p, written as f - s*(f - z*p) to keep the leading term exact-ish
    return fma(s * z, p, f32(2.0) * s), e


@func
def log_special(x: f32) -> f32:
    if x != x or x < 0.0:
        return f32(0.0) / f32(0.0)
    if x == 0.0:
        return -f32(1.0) / f32(0.0)
    return x                                   # +inf


@func
def log(x: f32) -> f32:
    if x != x or x <= 0.0 or x > 3.4028235e38:
        return log_special(x)
    lm, e = log_parts(x)
    ef = f32(e)
    return fma(ef, f32(LN2_HI), fma(ef, f32(LN2_LO), lm))


@func
def log2(x: f32) -> f32:
    if x != x or x <= 0.0 or x > 3.4028235e38:
        return log_special(x)
    lm, e = log_parts(x)
    return fma(lm, f32(LOG2E), f32(e))


@func
def tanh(x: f32) -> f32:
    a = abs(x)
    if a != a:
        return x
    if a < 0.55:
        z = x * x
        p = fma(z, f32(-443861162.0 / 1856156927625.0), f32(6404582.0 / 10854718875.0))
        p = fma(p, z, f32(-929569.0 / 638512875.0))
        p = fma(p, z, f32(21844.0 / 6081075.0))
        p = fma(p, z, f32(-1382.0 / 155925.0))
        p = fma(p, z, f32(62.0 / 2835.0))
        p = fma(p, z, f32(-17.0 / 315.0))
        p = fma(p, z, f32(2.0 / 15.0))
        p = fma(p, z, f32(-1.0 / 3.0))
        return fma(x * z, p, x)
    if a > 9.1:
        r = f32(1.0)
    else:
        r = f32(1.0) - f32(2.0) / (exp(a + a) + f32(1.0))
    return r if x > 0.0 else -r


@func
def erf(x: f32) -> f32:
    a = abs(x)
    if a != a:
        return x
    if a < 1.0:
        # erf(x) = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)), to n = 11
        z = x * x
        p = f32(-1.0 / (39916800.0 * 23.0))
        p = fma(p, z, f32(1.0 / (3628800.0 * 21.0)))
        p = fma(p, z, f32(-1.0 / (362880.0 * 19.0)))
        p = fma(p, z, f32(1.0 / (40320.0 * 17.0)))
        p = fma(p, z, f32(-1.0 / (5040.0 * 15.0)))
        p = fma(p, z, f32(1.0 / (720.0 * 13.0)))
        p = fma(p, z, f32(-1.0 / (120.0 * 11.0)))
        p = fma(p, z, f32(1.0 / (24.0 * 9.0)))
        p = fma(p, z, f32(-1.0 / (6.0 * 7.0)))
        p = fma(p, z, f32(1.0 / (2.0 * 5.0)))
        p = fma(p, z, f32(-1.0 / 3.0))
        p = fma(p, z, f32(1.0))
        return x * p * f32(1.1283791670955126)
    if a >= 4.0:
        r = f32(1.0)
    else:
        # erfc(a) ~= t * exp(-a*a + poly(t)), t = 1/(1 + a/2): relative error < 1.2e-7
        t = f32(1.0) / fma(a, f32(0.5), f32(1.0))
        p = fma(t, f32(0.17087277), f32(-0.82215223))
        p = fma(p, t, f32(1.48851587))
        p = fma(p, t, f32(-1.13520398))
        p = fma(p, t, f32(0.27886807))
        p = fma(p, t, f32(-0.18628806))
        p = fma(p, t, f32(0.09678418))
        p = fma(p, t, f32(0.37409196))
        p = fma(p, t, f32(1.00002368))
        p = fma(p, t, f32(-1.26551223))
        r = f32(1.0) - t * exp(fma(-a, a, p))
    return r if x > 0.0 else -r


@func
def sincos_reduce(x: f32):
    """x = k * pi/2 + r, |r| <= pi/4 (three-part Cody-Waite with fma); returns (r, k & 3)."""
    k = floor(fma(x, f32(0.6366197723675814), f32(0.5)))
    r = fma(-k, f32(1.5707963705062866), x)
    r = fma(-k, f32(-4.371139000186243e-08), r)
    r = fma(-k, f32(-1.7151245100059647e-15), r)
    return r, i32(k) & 3


@func
def sin_poly(r: f32) -> f32:
    z = r * r
    p = fma(z, f32(-1.0 / 39916800.0), f32(1.0 / 362880.0))
    p = fma(p, z, f32(-1.0 / 5040.0))
    p = fma(p, z, f32(1.0 / 120.0))
    p = fma(p, z, f32(-1.0 / 6.0))
    return fma(r * z, p, r)


@func
def cos_poly(r: f32) -> f32:
    z = r * r
    p = fma(z, f32(1.0 / 479001600.0), f32(-1.0 / 3628800.0))
    p = fma(p, z, f32(1.0 / 40320.0))
    p = fma(p, z, f32(-1.0 / 720.0))
    p = fma(p, z, f32(1.0 / 24.0))
    p = fma(p, z, f32(-0.5))
    return fma(z, p, f32(1.0))


@func
def sin(x: f32) -> f32:
    if x != x or abs(x) > 3.4028235e38:
        return f32(0.0) / f32(0.0)
    r, q = sincos_reduce(x)
    v = cos_poly(r) if (q & 1) == 1 else sin_poly(r)
    return -v if q >= 2 else v


@func
def cos(x: f32) -> f32:
    if x != x or abs(x) > 3.4028235e38:
        return f32(0.0) / f32(0.0)
    r, q = sincos_reduce(x)
    v = sin_poly(r) if (q & 1) == 1 else cos_poly(r)
    return -v if (q == 1 or q == 2) else v
