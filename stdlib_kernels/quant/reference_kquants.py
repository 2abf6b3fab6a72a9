"""Bit-exact numpy ports of ggml's K-quant reference quantizers (quantize_row_q{2..6}_K_ref).

Input: float32 super-blocks, shape (NB, 256). Output: the ggml block bytes, uint8 (NB, block
bytes); block layouts are in formats.py. No importance matrix (what `llama-quantize` does
without --imatrix).
"""
from __future__ import annotations

import numpy as np

from .reference_numerics import F32, f16_round, first_absmax, nearest_int, seq_sum, to_f16
from .reference_search import (GROUP_MAX_EPS, make_q3_quants, make_qkx2_quants,
                               make_qx_quants)


def _subblocks(xb: np.ndarray, size: int) -> np.ndarray:
    """(NB, 256) -> (size, NB * 256/size): element i of every sub-block is row i."""
    return np.ascontiguousarray(xb.reshape(-1, size).T)


def _from_subblocks(levels: np.ndarray, nb: int) -> np.ndarray:
    """Inverse of _subblocks: (size, NB*k) -> (NB, 256)."""
    return np.ascontiguousarray(levels.T).reshape(nb, 256)


def _positive_max(v: np.ndarray) -> np.ndarray:
    """C's `m = 0; if (v[j] > m) m = v[j];` over the last axis (NaN never wins, -0 stays +0)."""
    largest = np.fmax.reduce(v, axis=-1, initial=F32(0)).astype(F32)
    return np.where(largest > 0, largest, F32(0))


def _requantize(x, d, offset, lo: int, hi: int, levels):
    """ggml's final pass: l = clamp(nearest_int((x + offset)/d), lo, hi) where d != 0.

    x, levels: (NB, S, n); d, offset: (NB, S) (offset None for symmetric formats). Sub-blocks
    whose d is zero keep the levels of the scale search, as in the C code.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        num = x if offset is None else x + offset[..., None]
        fresh = np.clip(nearest_int(num / d[..., None]), lo, hi)
    return np.where((d != 0)[..., None], fresh - lo, levels)


def _pack_2bit(levels: np.ndarray) -> np.ndarray:
    """(NB, 256) levels 0..3 -> (NB, 64): byte 32h+l holds elements 128h+l+32k at bits 2k."""
    q = levels.reshape(-1, 2, 4, 32).astype(np.uint8)
    packed = q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)
    return packed.reshape(-1, 64)


def _pack_f16(*values: np.ndarray) -> np.ndarray:
    return np.stack([to_f16(v) for v in values], axis=-1).view(np.uint8)


def _quantize_scales_6bit(values: np.ndarray, vmax: np.ndarray) -> np.ndarray:
    """uint8 nearest_int(63/vmax * v) (0 when vmax <= 0), capped at 63, per K-quant sub-block."""
    with np.errstate(divide="ignore"):
        inv = np.where(vmax > 0, F32(63) / vmax, F32(0))
    return np.minimum(nearest_int(inv[:, None] * values) & 0xFF, 63).astype(np.uint8)


def _pack_scale_min_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins (NB, 8) -> the 12 scale bytes of Q4_K/Q5_K."""
    out = np.zeros((ls.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    out[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    return out


def _qkx_superblock(xb: np.ndarray, nmax: int, rmin: float, nstep: int):
    """Shared front half of Q4_K/Q5_K: search per 32-sub-block, 6-bit scales, requantize.

    Returns (d, dmin, scale bytes (NB, 12), levels (NB, 256) in 0..nmax).
    """
    nb = xb.shape[0]
    x = _subblocks(xb, 32)
    av_x = np.sqrt(seq_sum(x * x) / F32(32))
    weights = av_x + np.abs(x)
    scales, mins, levels = make_qkx2_quants(x, weights, nmax, rmin, 0.1, nstep, use_mad=False)
    scales, mins = scales.reshape(nb, 8), mins.reshape(nb, 8)
    max_scale, max_min = _positive_max(scales), _positive_max(mins)
    ls = _quantize_scales_6bit(scales, max_scale)
    lm = _quantize_scales_6bit(mins, max_min)
    d, dmin = max_scale / F32(63), max_min / F32(63)
    sub_d = f16_round(d)[:, None] * ls.astype(F32)
    sub_m = f16_round(dmin)[:, None] * lm.astype(F32)
    levels = _from_subblocks(levels, nb).reshape(nb, 8, 32).astype(np.int32)
    levels = _requantize(xb.reshape(nb, 8, 32), sub_d, sub_m, 0, nmax, levels)
    return d, dmin, _pack_scale_min_k4(ls, lm), levels.reshape(nb, 256)


def quantize_q4_k(xb: np.ndarray) -> np.ndarray:
    """Q4_K (144 B): d | dmin | scales[12] | qs[128] (chunk c: low nibbles 2c, high 2c+1)."""
    d, dmin, scale_bytes, levels = _qkx_superblock(xb, 15, -1.0, 20)
    q = levels.reshape(-1, 4, 2, 32).astype(np.uint8)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    return np.concatenate([_pack_f16(d, dmin), scale_bytes, qs], axis=1)


def quantize_q5_k(xb: np.ndarray) -> np.ndarray:
    """Q5_K (176 B): d | dmin | scales[12] | qh[32] | qs[128]; chunk c's 5th bits in qh bits
    2c (low nibbles) and 2c+1 (high nibbles)."""
    d, dmin, scale_bytes, levels = _qkx_superblock(xb, 31, -0.5, 15)
    q = levels.reshape(-1, 4, 2, 32).astype(np.uint8)
    qs = ((q[:, :, 0] & 0xF) | ((q[:, :, 1] & 0xF) << 4)).reshape(-1, 128)
    high = (q >> 4) << np.arange(8, dtype=np.uint8).reshape(1, 4, 2, 1)
    qh = np.bitwise_or.reduce(high.reshape(-1, 8, 32), axis=1)
    return np.concatenate([_pack_f16(d, dmin), scale_bytes, qh, qs], axis=1)


def quantize_q2_k(xb: np.ndarray) -> np.ndarray:
    """Q2_K (84 B): scales[16] (low nibble scale, high min) | qs[64] | d | dmin."""
    nb = xb.shape[0]
    x = _subblocks(xb, 16)
    scales, mins, levels = make_qkx2_quants(x, np.abs(x), 3, -0.5, 0.1, 15, use_mad=True)
    scales, mins = scales.reshape(nb, 16), mins.reshape(nb, 16)
    max_scale, max_min = _positive_max(scales), _positive_max(mins)
    with np.errstate(divide="ignore"):
        inv_s = np.where(max_scale > 0, F32(15) / max_scale, F32(0))
        inv_m = np.where(max_min > 0, F32(15) / max_min, F32(0))
    ls = (nearest_int(inv_s[:, None] * scales) & 0xFF) * (max_scale > 0)[:, None]
    lm = nearest_int(inv_m[:, None] * mins) * (max_min > 0)[:, None]
    sc = ((ls | (lm << 4)) & 0xFF).astype(np.uint8)
    d = np.where(max_scale > 0, max_scale / F32(15), F32(0))
    dmin = np.where(max_min > 0, max_min / F32(15), F32(0))
    sub_d = f16_round(d)[:, None] * (sc & 0xF).astype(F32)
    sub_m = f16_round(dmin)[:, None] * (sc >> 4).astype(F32)
    levels = _from_subblocks(levels, nb).reshape(nb, 16, 16).astype(np.int32)
    levels = _requantize(xb.reshape(nb, 16, 16), sub_d, sub_m, 0, 3, levels)
    return np.concatenate([sc, _pack_2bit(levels.reshape(nb, 256)), _pack_f16(d, dmin)], axis=1)


def quantize_q3_k(xb: np.ndarray) -> np.ndarray:
    """Q3_K (110 B): hmask[32] | qs[64] | scales[12] (16 six-bit, biased by 32) | d."""
    nb = xb.shape[0]
    scales, levels = make_q3_quants(_subblocks(xb, 16), 4)
    scales = scales.reshape(nb, 16)
    max_scale = first_absmax(scales, axis=1)[1]
    has_scale = max_scale != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = F32(-32) / max_scale
        q = nearest_int(iscale[:, None] * scales).astype(np.int8).astype(np.int32)
    q = (np.clip(q, -32, 31) + 32) * has_scale[:, None]
    d = np.where(has_scale, F32(1) / iscale, F32(0))
    sub_d = f16_round(d)[:, None] * (q - 32).astype(F32)
    sub_d = np.where(has_scale[:, None], sub_d, F32(0))
    levels = _from_subblocks(levels, nb).reshape(nb, 16, 16).astype(np.int32)
    levels = _requantize(xb.reshape(nb, 16, 16), sub_d, None, -4, 3, levels).reshape(nb, 256)
    high = (levels > 3).astype(np.uint8).reshape(nb, 8, 32) << np.arange(8, dtype=np.uint8)[:, None]
    hmask = np.bitwise_or.reduce(high, axis=1)
    scale_bytes = _pack_q3_scales(q.astype(np.uint8))
    return np.concatenate([hmask, _pack_2bit(levels & 3), scale_bytes, _pack_f16(d)], axis=1)


def _pack_q3_scales(q: np.ndarray) -> np.ndarray:
    """16 six-bit scales (NB, 16) -> 12 bytes: low nibbles of j and j+8 in byte j (j < 8),
    the 2 high bits of j in byte 8 + j%4 at bit 2*(j//4)."""
    out = np.zeros((q.shape[0], 12), dtype=np.uint8)
    out[:, :8] = (q[:, :8] & 0xF) | ((q[:, 8:] & 0xF) << 4)
    high = (q >> 4).reshape(-1, 4, 4) << (2 * np.arange(4, dtype=np.uint8))[:, None]
    out[:, 8:] = np.bitwise_or.reduce(high, axis=1)
    return out


def quantize_q6_k(xb: np.ndarray) -> np.ndarray:
    """Q6_K (210 B): ql[128] | qh[64] | scales: i8[16] | d."""
    nb = xb.shape[0]
    scales, levels = make_qx_quants(_subblocks(xb, 16), 32)
    scales = scales.reshape(nb, 16)
    max_scale = first_absmax(scales, axis=1)[1]
    live = np.abs(max_scale) >= GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F32(-128) / max_scale
        sc = np.minimum(127, nearest_int(iscale[:, None] * scales)).astype(np.int8)
        d = F32(1) / iscale
    sub_d = f16_round(d)[:, None] * sc.astype(F32)
    levels = _from_subblocks(levels, nb).reshape(nb, 16, 16).astype(np.int32)
    levels = _requantize(xb.reshape(nb, 16, 16), sub_d, None, -32, 31, levels)
    q = levels.reshape(nb, 2, 4, 32).astype(np.uint8)
    ql = np.concatenate([(q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4),
                         (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4)], axis=2)
    qh = ((q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4)
          | ((q[:, :, 3] >> 4) << 6))
    out = np.concatenate([ql.reshape(nb, 128), qh.reshape(nb, 64), sc.view(np.uint8),
                          _pack_f16(d)], axis=1)
    out[~live] = 0
    return out
