"""ggml's reference quantizers for the 32-element formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and BF16.

Input: float32 rows (rows, n). Output: uint8 (rows, row_bytes). gguf-py computes these bit for
bit except the sign of zero scales, which we set as ggml's C code does:
- Q4_0/Q5_0: an all-zero block keeps C's initial max = +0, so d = +0/-8 = -0.
- Q4_1/Q5_1: C's min and max are the first elements reaching them (with +-0 comparing equal),
  which decides the sign of m (and of d when both are zero).
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from .reference_numerics import F32, to_f16

_LEVELS = {"Q4_1": 15, "Q5_1": 31}


def quantize_legacy(rows: np.ndarray, name: str) -> np.ndarray:
    out = gguf_quants.quantize(rows, GGMLQuantizationType[name])
    if name in ("Q4_0", "Q5_0"):
        _fix_symmetric_zero_scale(rows, out)
    elif name in _LEVELS:
        _fix_affine_header(rows, out, _LEVELS[name])
    return out


def _fix_symmetric_zero_scale(rows: np.ndarray, out: np.ndarray) -> None:
    blocks = rows.reshape(-1, 32)
    header = out.reshape(blocks.shape[0], -1)[:, :2]
    all_zero = ~(np.abs(blocks) > 0).any(axis=1)
    header[all_zero] = to_f16(np.array([-0.0], F32)).view(np.uint8)


def _fix_affine_header(rows: np.ndarray, out: np.ndarray, levels: int) -> None:
    blocks = rows.reshape(-1, 32)
    header = out.reshape(blocks.shape[0], -1)[:, :4]
    lo = np.take_along_axis(blocks, np.argmin(_skip_nan(blocks, np.inf), axis=1)[:, None], 1)
    hi = np.take_along_axis(blocks, np.argmax(_skip_nan(blocks, -np.inf), axis=1)[:, None], 1)
    d = (hi[:, 0] - lo[:, 0]) / F32(levels)
    header[:] = np.stack([to_f16(d), to_f16(lo[:, 0])], axis=1).view(np.uint8)


def _skip_nan(v: np.ndarray, fill: float) -> np.ndarray:
    return np.where(np.isnan(v), F32(fill), v)
