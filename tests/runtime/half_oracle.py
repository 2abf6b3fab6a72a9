"""Exact references for f16 / bf16 arithmetic: an operation's exact rational value rounded
once to nearest even in the format (independent of the float32 tricks the compiler uses)."""
from fractions import Fraction

import numpy as np

# (stored mantissa bits, smallest normal exponent, largest exponent)
FORMATS = {"f16": (10, -14, 15), "bf16": (7, -126, 127)}


def to_float64(bits: np.ndarray, fmt: str) -> np.ndarray:
    bits = np.asarray(bits, np.uint16)
    if fmt == "f16":
        return bits.view(np.float16).astype(np.float64)
    with np.errstate(invalid="ignore"):         # signalling NaN patterns
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def to_bits(values: np.ndarray, fmt: str) -> np.ndarray:
    """Values already representable in the format -> their 16-bit patterns."""
    values = np.asarray(values, np.float64)
    if fmt == "f16":
        return values.astype(np.float16).view(np.uint16)
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def round_exact(q: Fraction, fmt: str) -> float:
    """The format's value nearest to q (ties to even), inf past the largest finite value."""
    mant, emin, emax = FORMATS[fmt]
    mag = abs(q)
    exp = mag.numerator.bit_length() - mag.denominator.bit_length()
    if Fraction(2) ** exp > mag:
        exp -= 1
    ulp = Fraction(2) ** (max(exp, emin) - mant)
    steps = mag // ulp
    rest = mag - steps * ulp
    if 2 * rest > ulp or (2 * rest == ulp and steps % 2 == 1):
        steps += 1
    value = steps * ulp
    result = float("inf") if value >= Fraction(2) ** (emax + 1) else float(value)
    return -result if q < 0 else result


def reference(op: str, fmt: str, *operand_bits) -> np.ndarray:
    """`op` in add sub mul fma applied element by element, correctly rounded -> bits."""
    xs = [to_float64(b, fmt) for b in operand_bits]
    out = np.empty(len(xs[0]))
    for i, vals in enumerate(zip(*xs)):
        with np.errstate(all="ignore"):      # f64 gives the special cases (zero signs, inf, nan)
            wide = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b,
                    "mul": lambda a, b: a * b,
                    "fma": lambda a, b, c: a * b + c}[op](*map(np.float64, vals))
        if not all(np.isfinite(vals)) or not np.isfinite(wide):
            out[i] = wide
            continue
        f = [Fraction(v) for v in vals]
        exact = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b,
                 "mul": lambda a, b: a * b, "fma": lambda a, b, c: a * b + c}[op](*f)
        out[i] = wide if exact == 0 else round_exact(exact, fmt)
    return to_bits(out, fmt)


def random_bits(rng, n: int, fmt: str) -> np.ndarray:
    """Random 16-bit patterns (every exponent, subnormals, zeros, inf) plus values near 1
    (where + and * round most often); NaN patterns replaced by finite ones."""
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    near_one = to_bits(rng.uniform(-4, 4, n // 2), fmt) if fmt == "f16" else \
        (rng.uniform(-4, 4, n // 2).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    bits[: n // 2] = near_one
    isnan = np.isnan(to_float64(bits, fmt))
    bits[isnan] &= 0x8000 | (0x3C00 if fmt == "f16" else 0x3F80)
    return bits
