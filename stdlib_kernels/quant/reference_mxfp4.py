"""ggml's reference MXFP4 quantizer (quantize_row_mxfp4_ref), in numpy.

Input: float32 blocks (blocks, 32). Output: uint8 (blocks, 17): e | qs[16].
Per block: amax = max |x|; e = floor(log2f(amax)) - 2 + 127 as u8 (0 for amax == 0); the
scale is half of 2^(e - 127) = 2^(e - 128) (ggml's e8m0_to_fp32_half: e < 2 gives an f32
subnormal); each value takes the first of the 16 codes whose |kvalue * scale - x| is smallest
(C's strict `<` scan from code 0). x[j] goes to the low nibble of qs[j], x[j + 16] to the high.
log2 is taken in float32 as ggml's log2f: just below a power of two it rounds up to the integer,
which changes e (computing e from the exponent bits would not be bit-exact).
"""
from __future__ import annotations

import numpy as np

from .reference_numerics import F32

# e2m1 values doubled (ggml's kvalues_mxfp4), code = sign << 3 | magnitude index
KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """2^(e - 128) as float32, exact (ggml's e8m0_to_fp32_half, built from the bits)."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(F32)


def quantize_mxfp4_blocks(blocks: np.ndarray) -> np.ndarray:
    amax = np.abs(blocks).max(axis=1)
    with np.errstate(divide="ignore"):
        exponent = np.floor(np.log2(amax, dtype=F32)) - F32(2) + F32(127)
    # C converts the float to uint8 (values below 0 only for amax < 2^-125: wrapped as x86 does)
    e = np.where(amax > 0, exponent, F32(0)).astype(np.int64).astype(np.uint8)
    scale = e8m0_half(e)[:, None]
    best = np.zeros(blocks.shape, np.uint8)
    best_err = np.abs(F32(KVALUES[0]) * scale - blocks)
    for code in range(1, 16):
        err = np.abs(F32(KVALUES[code]) * scale - blocks)
        better = err < best_err
        best = np.where(better, np.uint8(code), best)
        best_err = np.where(better, err, best_err)
    qs = best[:, :16] | (best[:, 16:] << np.uint8(4))
    return np.concatenate([e[:, None], qs], axis=1)
