"""float32 building blocks that reproduce ggml's C quantizers bit for bit.

Inputs and outputs are float32 numpy arrays. Arrays of sub-blocks are laid out (n, B): element i
of every sub-block is the contiguous row `a[i]`, so a C loop `for i in 0..n: acc += f(x[i])` runs
as n vectorised steps over all B sub-blocks, in the same order as the C code.
"""
from __future__ import annotations

import numpy as np

F32 = np.float32
_ROUND_MAGIC = F32(12582912.0)  # 1.5 * 2^23: adding it rounds to an integer in the low mantissa


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: round half to even through the 1.5*2^23 trick, as int32.

    Computed through the same bit trick (not np.rint) so out-of-range values (inf, nan, huge)
    give the same garbage integers as the C code when its assert is compiled out.
    """
    shifted = np.asarray(v, dtype=F32) + _ROUND_MAGIC
    return (shifted.view(np.int32) & 0x007FFFFF) - 0x00400000


def round_clip(v: np.ndarray, lo: int, hi: int, in_range: bool) -> np.ndarray:
    """clamp(nearest_int(v), lo, hi) as float32.

    in_range promises |v| < 4194303 everywhere (ggml's own assert bound); then the rounding stays
    in float32 (v + 1.5*2^23 has an integer ulp, so clamping there and subtracting the magic
    again is exact), which is about twice as fast as the integer bit trick used otherwise.
    """
    if not in_range:
        return np.clip(nearest_int(v), lo, hi).astype(F32)
    shifted = np.add(v, _ROUND_MAGIC, dtype=F32)
    np.clip(shifted, _ROUND_MAGIC + F32(lo), _ROUND_MAGIC + F32(hi), out=shifted)
    return np.subtract(shifted, _ROUND_MAGIC, out=shifted)


def within_round_range(bound: np.ndarray) -> bool:
    """True when every per-sub-block bound on |v| is safely inside round_clip's fast range."""
    return bool(np.all(bound < F32(4.0e6)))  # NaN bounds compare False: take the exact path


def first_absmax(v: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """C's `amax = 0; if (fabsf(v[i]) > amax) { amax = fabsf(v[i]); max = v[i]; }` along axis.

    Returns (amax, max): the largest magnitude and the signed value that first reached it, both
    +0 when no |v| exceeds 0; NaN never wins a C comparison, so it is skipped.
    """
    mags = np.abs(v)
    mags = np.where(np.isnan(mags), F32(0), mags)
    first = np.expand_dims(np.argmax(mags, axis=axis), axis)
    amax = np.take_along_axis(mags, first, axis=axis).squeeze(axis)
    signed = np.take_along_axis(v, first, axis=axis).squeeze(axis)
    return amax, np.where(amax > 0, signed, F32(0))


def roundf(v: np.ndarray) -> np.ndarray:
    """C roundf: round half away from zero, as float32.

    |v| + 0.5 is exact in float64 for every float32 v, so floor() there gives roundf exactly.
    """
    v = np.asarray(v, dtype=F32)
    return np.copysign(np.floor(np.abs(v).astype(np.float64) + 0.5), v).astype(F32)


def to_f16(v: np.ndarray) -> np.ndarray:
    """GGML_FP32_TO_FP16: round to nearest even half (inf beyond 65504), as float16."""
    with np.errstate(over="ignore"):
        return np.asarray(v, dtype=F32).astype(np.float16)


def f16_round(v: np.ndarray) -> np.ndarray:
    """GGML_FP16_TO_FP32(GGML_FP32_TO_FP16(v)): the float32 value a stored half reads back as."""
    return to_f16(v).astype(F32)


def seq_sum(terms: np.ndarray) -> np.ndarray:
    """Sum over axis 0 sequentially (acc = t[0]; acc += t[1]; ...), like a C loop.

    numpy's reduce over the outer axis of a C-contiguous array adds row after row (its pairwise
    summation applies only to the inner axis), which is the order we need.
    """
    return np.add.reduce(np.ascontiguousarray(terms, dtype=F32), axis=0)
