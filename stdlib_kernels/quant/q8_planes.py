"""Activations to "Q8 planes": int8 per 128 values, stored as 8 bit planes (the B operand of the
Q1_0 BMMA GEMV, gemv_q1_0.py).

    quantize_q8_planes(x) -> uint8 (rows, n//128*136)  x: float32 (n,) or (rows, n), n % 128 == 0
    quantize_q8_planes_into(x, out)                    preallocated out, no host sync
    reference_q8_planes(x)                             the same bytes from numpy

Row layout (u32 words; G = n // 128 groups of 128 values):
    words [0, 32 G)       group g's planes at 32 g + 4 p + t: bit i = bit p of q[128 g + 32 t + i]
                          (q as two's-complement int8: plane 7 is the sign, worth -128)
    words [32 G, 34 G)    group g's f32 d at 32 G + 2 g, f32 s = d * sum(q) at 32 G + 2 g + 1
Per group: d = amax / 127, q = roundf(x / d) (0 when amax == 0), as Q8_1 (q8_1.py) but over 128
values instead of 32. A warp reading one group's 32 plane words lane by lane gets exactly the
m16n8k128 B fragment (lane 4 p + t: column p, k = 32 t .. 32 t + 31).
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32

from .q8_1 import quantize_rows, round_half_away
from .reference_numerics import roundf

GROUP = 128
GROUP_WORDS = 34          # 32 plane words + d + s
_WARPS = 8


@pk.kernel
def q8_planes_kernel(x: Ptr[f32, "ro"], out: Ptr[u32], groups: i32, total: i32,
                     WARPS: Const[int]):
    """One warp per group of 128 values (group index over all rows): lane l holds values
    32 j + l (j = 0..3), so the ballot of bit p of q_j over the warp is plane word (p, t = j)."""
    pk.launch_dependents()   # decode: one short wave, let the GEMV launch now
    gi = pk.block_idx.x * WARPS + pk.thread_idx.x // 32
    lane = pk.lane_id()
    if gi < total:
        row = gi // groups
        g = gi % groups
        base = gi * GROUP
        v0 = x[base + lane]
        v1 = x[base + 32 + lane]
        v2 = x[base + 64 + lane]
        v3 = x[base + 96 + lane]
        amax = max(max(abs(v0), abs(v1)), max(abs(v2), abs(v3)))
        for step in pk.static_range(5):
            amax = max(amax, pk.shfl_xor(amax, 16 >> step))
        d = amax / 127.0
        q0, q1, q2, q3 = i32(0), i32(0), i32(0), i32(0)
        if amax != 0.0:
            q0 = i32(round_half_away(v0 / d))
            q1 = i32(round_half_away(v1 / d))
            q2 = i32(round_half_away(v2 / d))
            q3 = i32(round_half_away(v3 / d))
        total_q = q0 + q1 + q2 + q3
        for step in pk.static_range(5):
            total_q += pk.shfl_xor(total_q, 16 >> step)
        mine = u32(0)
        for p in pk.static_range(8):
            w0 = pk.ballot(((q0 >> p) & 1) != 0)
            w1 = pk.ballot(((q1 >> p) & 1) != 0)
            w2 = pk.ballot(((q2 >> p) & 1) != 0)
            w3 = pk.ballot(((q3 >> p) & 1) != 0)
            if lane // 4 == p:
                t = lane % 4
                mine = w0 if t == 0 else (w1 if t == 1 else (w2 if t == 2 else w3))
        row_words = groups * GROUP_WORDS
        out[row * row_words + 32 * g + lane] = mine
        if lane == 0:
            out[row * row_words + 32 * groups + 2 * g] = pk.bitcast(d, u32)
            out[row * row_words + 32 * groups + 2 * g + 1] = pk.bitcast(d * f32(total_q), u32)


def q8_planes_bytes(n: int) -> int:
    """Bytes of one Q8-planes row of n values."""
    return n // GROUP * GROUP_WORDS * 4


def _check(x, what: str) -> int:
    if x.dtype != np.float32:
        raise ValueError(f"{what}: activations must be float32, got {x.dtype}")
    n = x.shape[-1]
    if n % GROUP:
        raise ValueError(f"{what}: activation length {n} is not a multiple of {GROUP} "
                         "(one Q8-planes group per Q1_0 block)")
    return n


def quantize_q8_planes_into(x, out, stream=None) -> None:
    """Quantize float32 device rows x (..., n) into out: uint8 (..., n//128*136) (or u32 words).
    No allocation, no synchronisation: safe inside a captured CUDA graph."""
    n = _check(x, "quantize_q8_planes")
    total = x.size // GROUP
    if out.nbytes != total * GROUP_WORDS * 4:
        raise ValueError(f"quantize_q8_planes: output has {out.nbytes} bytes, {total} groups of "
                         f"128 values need {total * GROUP_WORDS * 4}")
    words = out.reshape(-1).view(np.uint32) if out.dtype != np.uint32 else out.reshape(-1)
    q8_planes_kernel[(total + _WARPS - 1) // _WARPS, _WARPS * 32, stream](
        x.reshape(-1), words, n // GROUP, total, _WARPS)


def quantize_q8_planes(x):
    """float32 (n,) or (rows, n) array (numpy or device) -> device uint8 Q8-planes rows."""
    return quantize_rows(x, q8_planes_bytes, quantize_q8_planes_into)


def reference_q8_planes(x: np.ndarray) -> np.ndarray:
    """numpy: float32 (rows, n) -> uint8 (rows, n//128*136), the kernel's bytes exactly."""
    x = np.asarray(x, dtype=np.float32)
    x = x.reshape(1, -1) if x.ndim == 1 else x
    _check(x, "reference_q8_planes")
    rows, groups = x.shape[0], x.shape[1] // GROUP
    blocks = x.reshape(rows, groups, GROUP)
    amax = np.abs(blocks).max(axis=2)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(amax[..., None] == 0, np.float32(0), roundf(blocks / d[..., None]))
    q = q.astype(np.int32)
    bits = (q.astype(np.int8).view(np.uint8)[..., None] >> np.arange(8, dtype=np.uint8)) & 1
    # (rows, groups, 8 planes, 128 values) -> 16 bytes per plane, little-endian bit order
    planes = np.packbits(bits.transpose(0, 1, 3, 2), axis=3, bitorder="little")
    scales = np.stack([d, d * q.sum(axis=2).astype(np.float32)], axis=2).astype(np.float32)
    return np.concatenate([planes.reshape(rows, -1),
                           scales.view(np.uint8).reshape(rows, -1)], axis=1)


def dequantize_q8_planes(raw: np.ndarray, n: int) -> tuple:
    """(q as float64 (rows, n), d (rows, n//128), s (rows, n//128)) from Q8-planes rows."""
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1, q8_planes_bytes(n))
    rows, groups = raw.shape[0], n // GROUP
    planes = raw[:, :groups * 128].reshape(rows, groups, 8, 16)
    bits = np.unpackbits(planes, axis=3, bitorder="little")           # (rows, G, 8, 128)
    weights = np.array([1, 2, 4, 8, 16, 32, 64, -128], np.int64)[None, None, :, None]
    q = (bits.astype(np.int64) * weights).sum(axis=2).reshape(rows, n)
    scales = raw[:, groups * 128:].copy().view(np.float32).reshape(rows, groups, 2)
    return q.astype(np.float64), scales[..., 0].astype(np.float64), \
        scales[..., 1].astype(np.float64)
