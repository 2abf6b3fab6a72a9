"""Host (numpy) codecs of the 8-bit float formats: numpy has no fp8 dtype, so fp8 arrays are
uint8 codes. `encode` rounds as the hardware's `cvt.rn.satfinite` (nearest even; finite
overflow and infinities saturate to the largest finite value; NaN -> 0x7F with the sign;
decoding any NaN code gives 0x7FFFFFFF, as the hardware does);
`decode` is exact. Formats: e4m3 (bias 7, max 448, no infinities) and e5m2 (bias 15, max
57344; the top byte of an f16). The kernels' pk.fp8_encode / pk.fp8_decode give the same bits.

    codes = pykernel.fp8.encode(np.float32 array, "e4m3")   -> uint8 array
    values = pykernel.fp8.decode(codes, "e4m3")              -> float32 array
"""
from __future__ import annotations

import numpy as np

FORMATS = {"e4m3": (4, 3, 7, 448.0), "e5m2": (5, 2, 15, 57344.0)}


def _spec(fmt):
    if fmt not in FORMATS:
        raise ValueError(f"fp8 format must be 'e4m3' or 'e5m2', got {fmt!r}")
    return FORMATS[fmt]


def decode(codes, fmt: str) -> np.ndarray:
    ebits, mbits, bias, _ = _spec(fmt)
    c = np.asarray(codes)
    if c.dtype != np.uint8:
        raise TypeError(f"fp8 codes are a uint8 array, got {c.dtype}")
    c = c.astype(np.int64)
    exp, man = (c >> mbits) & ((1 << ebits) - 1), c & ((1 << mbits) - 1)
    scale = np.ldexp(1.0, np.maximum(exp, 1) - bias - mbits)
    mag = np.where(exp == 0, man, man + (1 << mbits)) * scale
    top = (1 << ebits) - 1
    if fmt == "e4m3":
        mag = np.where((exp == top) & (man == 7), np.nan, mag)
    else:
        mag = np.where(exp == top, np.where(man == 0, np.inf, np.nan), mag)
    out = np.where(c >> 7, -mag, mag).astype(np.float32)
    # every NaN code decodes to 0x7FFFFFFF, sign dropped, as sm_89+'s cvt does (H200)
    out.view(np.uint32)[np.isnan(out)] = 0x7FFFFFFF
    return out


def encode(values, fmt: str) -> np.ndarray:
    _, mbits, bias, top = _spec(fmt)
    x = np.asarray(values, dtype=np.float32).astype(np.float64)
    mag = np.nan_to_num(np.abs(x), nan=0.0, posinf=np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
    e = np.clip(e, 1 - bias, 64)          # infinities: any binade above the max saturates
    ulp = np.ldexp(1.0, (e - mbits).astype(np.int64))
    with np.errstate(invalid="ignore"):
        rounded = np.minimum(np.rint(mag / ulp) * ulp, top)       # rint: nearest even
    rounded = np.where(np.isinf(mag), top, rounded)
    units = np.rint(np.nan_to_num(rounded) / np.ldexp(1.0, 1 - bias - mbits)).astype(np.int64)
    # units: the value in steps of the smallest subnormal; codes above 2^mbits are normal
    exp_field = np.where(units >= (1 << mbits),
                         np.floor(np.log2(np.maximum(units, 1))).astype(np.int64) - mbits + 1, 0)
    man = np.where(exp_field > 0, (units >> np.maximum(exp_field - 1, 0)) - (1 << mbits), units)
    code = (exp_field << mbits) | man
    code = np.where(np.isnan(x), 0x7F, code) | np.where(np.signbit(x), 0x80, 0)
    return code.astype(np.uint8)
