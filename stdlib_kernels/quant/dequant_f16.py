"""Dequantize GGUF weight rows to f16 in one bandwidth-bound pass (the weight scratch of
matmul_dequant.py's route: dequantize once, then multiply on gemm_hopper's f16 wgmma).

    dequantize_f16_into(words, "Q4_K", out, rows, n)    words: gemv.weight_words of the rows;
                                                        out: f16 (rows, n) (or flat, >= rows n)

The matrix is read as one flat run of blocks (rows are stored back to back), so no thread
divides by the row length: 8 threads write each 256-value span, 32 values a thread as four
16-byte stores, each store instruction filling whole 128-byte lines (dequant_f16_lanes.py).
Q4_K, Q5_K and Q6_K have decoders of their own (vector loads of the super-block, each scale
decoded once per 8 values); the other formats call decode8 per 8 values. Values are decode8's
f32 (= quant.reference.dequantize, the products ggml's dequantizers use) rounded to the
nearest f16 (pack_f16x2): the same weights gemm.py's and gemm_hopper_quant's tiles hold.
Graph-capturable: no allocation, no host synchronisation.
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, i32, u32

from .. import _launch as L
from .dequant_f16_lanes import lane_generic, lane_q4_legacy, lane_q45k, lane_q6k
from .formats import Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, get_format

# the quantized formats decode8 reads (F16 / F32 / BF16 weights need no dequant pass)
DEQUANT_F16_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                     "Q6_K", "Q1_0", "MXFP4")
THREADS = 256
LANES = 8               # threads per 256 output values (32 values, 4 stores each)
_I32_LIMIT = 1 << 31
MAX_F16_VALUES = _I32_LIMIT - 256  # values of one call: i32 value indices, a span past the end


@pk.kernel
def dequant_f16_flat(w: Ptr["WT", "ro"], out: Ptr[u32], threads: i32, values: i32,
                     FMT: Const[int], WT: Const[pk.dtype]):
    # grid (ceil(threads / THREADS)), threads = 8 per 256 values: thread t writes 32 values of
    # the 256-value span t // 8 of the flat matrix (rows back to back), as dequant_f16_lanes
    # describes; out: f16 (rows, n) viewed as u32 pairs
    t = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if t < threads:
        span = t // LANES
        j = t % LANES
        if FMT == Q4_K:
            lane_q45k(FMT, w, out, span, j)
        elif FMT == Q5_K:
            lane_q45k(FMT, w, out, span, j)
        elif FMT == Q6_K:
            lane_q6k(w, out, span, j)
        elif FMT == Q4_0:
            lane_q4_legacy(FMT, w, out, span, j, values, WT)
        elif FMT == Q4_1:
            lane_q4_legacy(FMT, w, out, span, j, values, WT)
        else:
            lane_generic(FMT, w, out, span, j, values)


def check_f16_rows(type_name: str, n: int) -> None:
    """ValueError unless `type_name` rows of n values can be dequantized to f16 here."""
    fmt = get_format(type_name)
    if type_name not in DEQUANT_F16_TYPES:
        raise ValueError(f"dequantize_f16: {type_name} is not a quantized format decode8 "
                         f"reads; served: {', '.join(DEQUANT_F16_TYPES)}")
    step = max(fmt.block_elems, 8)
    if n <= 0 or n % step:
        raise ValueError(f"dequantize_f16 {type_name}: row length {n} must be a positive "
                         f"multiple of {step}")


def dequantize_f16_into(words, type_name: str, out, rows: int, n: int, stream=None) -> None:
    """out[:rows * n] = the f16 values of `rows` rows of n values of `type_name`, whose blocks
    are `words` (gemv.weight_words: the word dtype the format's decode8 reads). out: a device
    f16 array of at least rows x n elements, 16-byte aligned. No allocation."""
    check_f16_rows(type_name, n)
    fmt = get_format(type_name)
    row_bytes = n // fmt.block_elems * fmt.block_bytes
    if words.size * words.itemsize < rows * row_bytes:
        raise ValueError(f"dequantize_f16 {type_name}: {rows} rows of {n} values take "
                         f"{rows * row_bytes} bytes, the weights hold "
                         f"{words.size * words.itemsize}")
    if np.dtype(out.dtype) != np.float16 or out.size < rows * n:
        raise ValueError(f"dequantize_f16 {type_name}: out must be float16 with at least "
                         f"{rows} x {n} elements, got {out.dtype} {tuple(out.shape)}")
    if out.ptr % 16:
        raise ValueError(f"dequantize_f16 {type_name}: out must be 16-byte aligned (16-byte "
                         f"stores)")
    if rows * row_bytes >= _I32_LIMIT or rows * n > MAX_F16_VALUES:
        raise ValueError(f"dequantize_f16 {type_name}: {rows} x {n} is past the kernel's i32 "
                         f"word and value indices; dequantize fewer rows per call")
    values = rows * n
    threads = (values + 255) // 256 * LANES
    flat = out.view_as((values // 2,), np.uint32)
    L.launch(dequant_f16_flat, (threads + THREADS - 1) // THREADS, THREADS,
             (words, flat, threads, values), (("FMT", fmt.id), ("WT", words.dtype)), stream)


__all__ = ["DEQUANT_F16_TYPES", "MAX_F16_VALUES", "check_f16_rows", "dequant_f16_flat",
           "dequantize_f16_into"]
