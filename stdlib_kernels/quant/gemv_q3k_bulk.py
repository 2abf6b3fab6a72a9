"""Q3_K decode GEMV for weights larger than L2 (sm_90+; the CPU target too): each warp's rows
arrive whole in shared memory by TMA bulk copies, then the DP4A "wide" math reads them there.

Input: w = gemv.weight_words(raw, "Q3_K", n) as u32 words, rows of nb = n / 256 blocks with
nb % 8 == 0 (a row is then 110 nb bytes, a multiple of 16: one bulk copy per row); xq the Q8_1
activations of one token; res (rows,) for the residual mode. Output: y (rows,) = W x [+ res].

Why: the register kernel (gemv_kernels, "wide" Q3_K items) reads each 110-byte block as 28
scattered 4-byte loads, and ptxas keeps only so many of them in flight per warp (78% of copy
bandwidth at 57344 x 4096 on the H200, against 85-107% for formats with aligned blocks). Here
one instruction per row moves the bytes, the copy engine keeps a warp's R rows (R x 1760 bytes
at n = 4096) in flight, and the scattered reads hit shared memory. The copies are issued before
`griddepcontrol.wait` (weights never depend on the previous kernel; x does).

Work split: a warp owns R consecutive rows; lane l takes items l, l + 32, ... (item = half of a
block, 128 values: dot_q8_k.q3k_wide_values / q3k_wide_sum), its activations loaded once for
all R rows; the lanes' sums meet by shuffles.
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32, u64

from .._device import warp_sum
from .dot_q8 import act_copy
from .dot_q8_k import q3k_wide_sum, q3k_wide_values
from .gemv_q1_0 import L2_BYTES, bulk_available
from .q8_1 import q8_1_bytes

BLOCK_BYTES = 110
# fastest of 11 shapes on the H200 (benchmarks/RESULTS.md, "Q3_K rows by bulk copies"):
# 57344 x 4096 29.3 us (88% of copy; register kernel 32.7, 78%), 128256 x 4096 58.0 (99%; 67.7)
ROWS_PER_WARP = 3            # R
WARPS = 4


@pk.kernel
def gemv_q3k_bulk(w: Ptr[u32, "ro"], xq: Ptr[u32, "ro"], res: Ptr[f32], y: Ptr[f32],
                  rows: i32, row_words: i32, nb: i32, R: Const[int], WARPS: Const[int],
                  RESIDUAL: Const[int]):
    lane = pk.lane_id()
    warp = pk.thread_idx.x // 32
    row0 = (pk.block_idx.x * WARPS + warp) * R
    sm = pk.dynamic_shared(u32)
    bars = pk.shared_array(u64, WARPS)
    base = warp * R * row_words
    if lane == 0:
        pk.mbarrier_init(bars, warp, 1)
        pk.fence_mbarrier_init()
    pk.syncwarp()
    if lane == 0:
        pk.mbarrier_arrive_expect_tx(bars, warp, R * row_words * 4)
    for i in pk.static_range((R + 31) // 32):
        r = lane + 32 * i
        if r < R:                              # rows past the end: the last row again
            pk.bulk_copy(sm, base + r * row_words, w, min(row0 + r, rows - 1) * row_words,
                         row_words * 4, bars, warp)
    pk.grid_dependency_wait()
    acc = pk.local_array(f32, R)
    for r in pk.static_range(R):
        acc[r] = 0.0
    v = pk.local_array(u32, 32)
    sc = pk.local_array(i32, 8)
    a = pk.local_array(u32, 36)
    pk.mbarrier_wait(bars, warp, 0)
    for item in range(lane, 2 * nb, 32):
        blk = item // 2
        n = item % 2
        act_copy(xq, 9 * (8 * blk + 4 * n), a, 36, 4)
        for r in pk.static_range(R):
            d = q3k_wide_values(sm, base + r * row_words, blk, n, v, sc)
            acc[r] += d * q3k_wide_sum(v, sc, a)
    for r in pk.static_range(R):
        total = warp_sum(acc[r])
        if lane == r % 32 and row0 + r < rows:
            if RESIDUAL:
                total += res[row0 + r]
            y[row0 + r] = total


def bulk_eligible(rows: int, n: int) -> bool:
    """The bulk kernel applies: sm_90+ (or the CPU target), rows of a multiple of 8 blocks,
    and weights larger than L2 (below it the register kernel's reads hit L2 on later calls)."""
    return bulk_available() and n % 2048 == 0 and rows * (n // 256) * BLOCK_BYTES > L2_BYTES


def gemv_q3k_bulk_into(w, xq, y, rows: int, n: int, *, res=None, stream=None,
                       rows_per_warp: int = ROWS_PER_WARP, warps: int = WARPS):
    """y (rows,) = W x [+ res] for one token: w u32 words of the rows (gemv.weight_words),
    xq its Q8_1 activations (q8_1_bytes(n) bytes)."""
    if n % 2048:
        raise ValueError(f"gemv Q3_K bulk: row length {n} must be a multiple of 2048 "
                         f"(8 blocks: 16-byte rows for the bulk copies)")
    if xq.nbytes < q8_1_bytes(n) or y.size != rows or y.dtype != np.float32:
        raise ValueError(f"gemv Q3_K bulk: activations of {xq.nbytes} bytes (need "
                         f"{q8_1_bytes(n)}) or output {y.dtype} {tuple(y.shape)} (need "
                         f"float32 ({rows},)) do not fit")
    row_words = n // 256 * BLOCK_BYTES // 4
    if w.ptr % 16 or w.nbytes < rows * row_words * 4:
        raise ValueError(f"gemv Q3_K bulk: weights must be a 16-byte aligned buffer of at least "
                         f"{rows} x {row_words * 4} bytes, got {w.nbytes} bytes at offset "
                         f"{w.ptr % 16} from 16-byte alignment")
    per_block = warps * rows_per_warp
    grid = (rows + per_block - 1) // per_block
    shared = warps * rows_per_warp * row_words * 4
    gemv_q3k_bulk[grid, 32 * warps, stream, shared](
        w.view(np.uint32), xq.reshape(-1).view(np.uint32), y if res is None else res, y, rows,
        row_words, n // 256, rows_per_warp, warps, int(res is not None))
