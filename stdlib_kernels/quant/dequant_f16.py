"""Dequantize GGUF weight rows to f16 in one bandwidth-bound pass (the weight scratch of
matmul_dequant.py's route: dequantize once, then multiply on gemm_hopper's f16 wgmma).

    dequantize_f16_into(words, "Q4_K", out, rows, n)    words: gemv.weight_words of the rows;
                                                        out: f16 (rows, n) (or flat, >= rows n)

Each thread decodes 8 consecutive values of one row with decode8 (word loads of its block, the
header once) and writes them as one 16-byte store, so a warp writes 512 contiguous bytes and
reads the 1-2 blocks they come from (a K-quant warp: one 256-value super-block). Values are
decode8's f32 (= quant.reference.dequantize, the products ggml's dequantizers use) rounded to
the nearest f16 (pack_f16x2): the same weights gemm.py's and gemm_hopper_quant's tiles hold.
Graph-capturable: no allocation, no host synchronisation.
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, i32, i64, u32

from .. import _launch as L
from .decode8_k import decode8
from .formats import get_format

# the quantized formats decode8 reads (F16 / F32 / BF16 weights need no dequant pass)
DEQUANT_F16_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                     "Q6_K", "Q1_0", "MXFP4")
THREADS = 256
_I32_LIMIT = 1 << 31


@pk.kernel
def dequant_f16_rows(w: Ptr["WT", "ro"], out: Ptr[u32], groups: i32, row_groups: i32,
                     row_words: i32, FMT: Const[int], WT: Const[pk.dtype]):
    # grid (ceil(groups / THREADS)): thread g writes values 8 (g % row_groups) .. + 7 of row
    # g // row_groups as 4 f16 pairs at out word 4 g (out: f16 (rows, n) viewed as u32 pairs)
    g = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if g < groups:
        row = g // row_groups
        k = (g - row * row_groups) * 8
        v0, v1, v2, v3, v4, v5, v6, v7 = decode8(FMT, w, row * row_words, k)
        pk.store_vec(out, i64(g) * i64(4), (pk.pack_f16x2(v0, v1), pk.pack_f16x2(v2, v3),
                                            pk.pack_f16x2(v4, v5), pk.pack_f16x2(v6, v7)))


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
    if rows * row_bytes >= _I32_LIMIT or rows * n // 8 >= _I32_LIMIT:
        raise ValueError(f"dequantize_f16 {type_name}: {rows} x {n} is past the kernel's i32 "
                         f"word and group indices; dequantize fewer rows per call")
    groups = rows * n // 8
    flat = out.view_as((rows * n // 2,), np.uint32)
    L.launch(dequant_f16_rows, (groups + THREADS - 1) // THREADS, THREADS,
             (words, flat, groups, n // 8, row_bytes // words.itemsize),
             (("FMT", fmt.id), ("WT", words.dtype)), stream)


__all__ = ["DEQUANT_F16_TYPES", "check_f16_rows", "dequantize_f16_into", "dequant_f16_rows"]
