"""Q3_K and Q6_K decode GEMV for large weight matrices (sm_90+; the CPU target too): each
warp's rows arrive whole in shared memory by TMA bulk copies, then the DP4A math reads them
there.

Input: w = gemv.weight_words(raw, type, n) as u32 words, rows of nb = n / 256 blocks with
nb % 8 == 0 (a row is then a multiple of 16 bytes: one bulk copy per row); xq the Q8_1
activations of one token; res (rows,) for the residual mode. Output: y (rows,) = W x [+ res].

Why: both formats have blocks that are only 2-byte aligned (110 and 210 bytes), so the
register kernels (gemv_kernels) read them as scattered 4-byte loads, and ptxas keeps only so
many of those in flight per warp (H200: Q3_K 78% of copy bandwidth at 57344 x 4096, Q6_K
58% at 4096 x 14336, against 85-107% for formats with aligned blocks). Here one instruction per
row moves the bytes, the copy engine keeps a warp's R rows in flight, and the scattered reads
hit shared memory. The copies are issued before `griddepcontrol.wait` (weights never depend on
the previous kernel; x does).

Work split: a warp owns groups of R consecutive rows; lane l takes items l, l + 32, ... (item =
half of a block, 128 values: dot_q8_k.q3k_wide_* / q6k_wide_*), its activations loaded once
for all R rows; the lanes' sums meet by shuffles. One stage (S = 1): one group per warp, a
block per WARPS groups. S >= 2: one wave of blocks whose warps loop over the groups through a
ring of S stages, so a warp's next rows are in flight while it computes.
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32, u64

from .._device import warp_sum
from .decode8 import Q3_K, Q6_K
from .dot_q8 import act_copy
from .dot_q8_k import q3k_wide_sum, q3k_wide_values, q6k_wide_sum, q6k_wide_values
from .gemv_q1_0 import L2_BYTES, bulk_available
from .q8_1 import q8_1_bytes

BULK_TYPES = {"Q3_K": Q3_K, "Q6_K": Q6_K}
BLOCK_BYTES = {"Q3_K": 110, "Q6_K": 210}
# (warps per block, rows per warp, ring stages), fastest on the H200 (benchmarks/RESULTS.md,
# "Q3_K rows by bulk copies" and "Q6_K rows by bulk copies")
TUNED = {"Q3_K": (4, 3, 1), "Q6_K": (4, 1, 1)}
SHARED_PER_SM = 228 << 10      # sm_90 / sm_100: shared memory per multiprocessor
SHARED_RESERVED = 1 << 10      # ... of which the driver reserves this much per block
# Q6_K: the smallest weights the bulk kernel takes by default (below, the register kernel)
Q6K_MIN_BYTES = 16 << 20


@pk.func
def item_dot(FMT: Const[int], sm: Ptr[u32], wrow: i32, blk: i32, n: i32, a) -> f32:
    """Item n of block blk of the row at shared word wrow times the activations in a."""
    if FMT == Q6_K:
        v = pk.local_array(i32, 32)
        sc = pk.local_array(i32, 8)
        d = q6k_wide_values(sm, wrow, blk, n, v, sc)
        return d * q6k_wide_sum(v, sc, a)
    else:
        v = pk.local_array(u32, 32)
        sc = pk.local_array(i32, 8)
        d = q3k_wide_values(sm, wrow, blk, n, v, sc)
        return d * q3k_wide_sum(v, sc, a)


@pk.func
def issue_group(w: Ptr[u32, "ro"], sm, bars, bar: i32, stage: i32, row0: i32, rows: i32,
                row_words: i32, lane: i32, R: Const[int]):
    """Rows row0 .. row0 + R - 1 into the stage at shared word `stage` (lane r copies row r;
    rows past the end: the last row again), their bytes announced on mbarrier `bar`."""
    if lane == 0:
        pk.mbarrier_arrive_expect_tx(bars, bar, R * row_words * 4)
    for i in pk.static_range((R + 31) // 32):
        r = lane + 32 * i
        if r < R:
            pk.bulk_copy(sm, stage + r * row_words, w, min(row0 + r, rows - 1) * row_words,
                         row_words * 4, bars, bar)


@pk.kernel
def gemv_bulk(w: Ptr[u32, "ro"], xq: Ptr[u32, "ro"], res: Ptr[f32], y: Ptr[f32],
              rows: i32, row_words: i32, nb: i32, FMT: Const[int], R: Const[int],
              WARPS: Const[int], S: Const[int], RESIDUAL: Const[int]):
    """Each warp takes groups of R rows, first = its index in the grid, then every
    (grid warps)-th: a ring of S stages per warp, the first S groups' copies issued before
    the PDL wait, a stage refilled with the group S ahead once read."""
    lane = pk.lane_id()
    warp = pk.thread_idx.x // 32
    sm = pk.dynamic_shared(u32)
    bars = pk.shared_array(u64, WARPS * S)
    SW = R * row_words
    base = warp * S * SW
    if lane == 0:
        for s in pk.static_range(S):
            pk.mbarrier_init(bars, warp * S + s, 1)
        pk.fence_mbarrier_init()
    pk.syncwarp()
    step = pk.grid_dim.x * WARPS
    first = pk.block_idx.x * WARPS + warp
    groups = (rows + R - 1) // R
    rounds = 0
    if first < groups:
        rounds = (groups - first + step - 1) // step
    for s in pk.static_range(S):
        if s < rounds:
            issue_group(w, sm, bars, warp * S + s, base + s * SW, (first + s * step) * R, rows,
                        row_words, lane, R)
    pk.grid_dependency_wait()
    acc = pk.local_array(f32, R)
    a = pk.local_array(u32, 36)
    for rd in range(rounds):
        stage = base + rd % S * SW
        row0 = (first + rd * step) * R
        for r in pk.static_range(R):
            acc[r] = 0.0
        pk.mbarrier_wait(bars, warp * S + rd % S, (rd // S) % 2)
        for item in range(lane, 2 * nb, 32):
            blk = item // 2
            n = item % 2
            act_copy(xq, 9 * (8 * blk + 4 * n), a, 36, 4)
            for r in pk.static_range(R):
                acc[r] += item_dot(FMT, sm, stage + r * row_words, blk, n, a)
        for r in pk.static_range(R):
            total = warp_sum(acc[r])
            if lane == r % 32 and row0 + r < rows:
                if RESIDUAL:
                    total += res[row0 + r]
                y[row0 + r] = total
        pk.syncwarp()                          # the stage is read before it is refilled
        if rd + S < rounds:
            issue_group(w, sm, bars, warp * S + rd % S, stage, (first + (rd + S) * step) * R,
                        rows, row_words, lane, R)


def bulk_eligible(type_name: str, rows: int, n: int) -> bool:
    """The bulk kernel applies by default: sm_90+ (or the CPU target), rows of a multiple of 8
    blocks, and large weights: Q3_K over L2 (below it the register kernel's reads hit L2 on
    later calls), Q6_K from Q6K_MIN_BYTES (its register kernel is slower from HBM and L2)."""
    if type_name not in BULK_TYPES or not bulk_available() or n % 2048:
        return False
    nbytes = rows * (n // 256) * BLOCK_BYTES[type_name]
    return nbytes > (L2_BYTES if type_name == "Q3_K" else Q6K_MIN_BYTES)


def resident_blocks(shared: int, threads: int) -> int:
    """Blocks of `shared` bytes of shared memory and `threads` threads that fit the GPU at once
    (the CPU target: 2)."""
    device = pk.current_device()
    if device.kind != "cuda":
        return 2
    sms = int(device.core.properties.multiprocessor_count)
    per_sm = min(SHARED_PER_SM // (shared + SHARED_RESERVED), 2048 // threads)
    return max(1, per_sm) * sms


def gemv_bulk_into(w, type_name: str, xq, y, rows: int, n: int, *, res=None, stream=None,
                   rows_per_warp: int | None = None, warps: int | None = None,
                   stages: int | None = None):
    """y (rows,) = W x [+ res] for one token: w u32 words of the rows (gemv.weight_words),
    xq its Q8_1 activations (q8_1_bytes(n) bytes); type_name Q3_K or Q6_K. stages 1: one
    group of rows per warp, as many blocks as groups; >= 2: a ring of that many groups per
    warp and one wave of blocks that loop over the rows."""
    if type_name not in BULK_TYPES:
        raise ValueError(f"gemv bulk: no bulk-copy kernel for {type_name}; supported: "
                         f"{sorted(BULK_TYPES)}")
    what = f"gemv {type_name} bulk"
    if n % 2048:
        raise ValueError(f"{what}: row length {n} must be a multiple of 2048 "
                         f"(8 blocks: 16-byte rows for the bulk copies)")
    if xq.nbytes < q8_1_bytes(n) or y.size != rows or y.dtype != np.float32:
        raise ValueError(f"{what}: activations of {xq.nbytes} bytes (need "
                         f"{q8_1_bytes(n)}) or output {y.dtype} {tuple(y.shape)} (need "
                         f"float32 ({rows},)) do not fit")
    row_words = n // 256 * BLOCK_BYTES[type_name] // 4
    if w.ptr % 16 or w.nbytes < rows * row_words * 4:
        raise ValueError(f"{what}: weights must be a 16-byte aligned buffer of at least "
                         f"{rows} x {row_words * 4} bytes, got {w.nbytes} bytes at offset "
                         f"{w.ptr % 16} from 16-byte alignment")
    tuned = TUNED[type_name]
    warps = warps or tuned[0]
    rows_per_warp = rows_per_warp or tuned[1]
    stages = stages or tuned[2]
    per_block = warps * rows_per_warp
    grid = (rows + per_block - 1) // per_block
    shared = warps * stages * rows_per_warp * row_words * 4
    if stages > 1:
        grid = min(grid, resident_blocks(shared, 32 * warps))
    gemv_bulk[grid, 32 * warps, stream, shared](
        w.view(np.uint32), xq.reshape(-1).view(np.uint32), y if res is None else res, y, rows,
        row_words, n // 256, BULK_TYPES[type_name], rows_per_warp, warps, stages,
        int(res is not None))
