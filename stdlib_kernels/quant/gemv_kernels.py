"""Decode GEMV kernels on GGUF weight rows: y[b, r] = sum_k W[r, k] * x[b, k] for 1..8 tokens.

    gemv_q8_kernel   x as Q8_1 (q8_1.py), DP4A integer dot products (dot_q8*.py)
    gemv_f32_kernel  x as float32, weights decoded to f32 eight at a time (decode8.py)

Grid: a thread block of WARPS warps holds WARPS / KW row groups; each group of KW warps computes
ROWS output rows, its threads striding over the rows' items (16..105 bytes of weights each,
per format variant; WIDEN consecutive items per thread visit), UNROLL visits per loop trip with
no bounds checks inside the trip (so all their loads are in flight together). Blocks stride
over the row groups (the grid may be smaller: a persistent grid); STAGE_X = 1 first copies x
to dynamic shared memory. Each weight item is loaded once and applied to every token (BATCH
accumulators per row in registers). Reduction: warp shuffles, plus shared memory when KW > 1.
Rows past the end are clamped for the loads and not stored. MODE fuses the epilogue:
0 plain, 1 y = Wx + res (residual add; res may alias y), 2 y = silu(Wx) * (W2 x) (SwiGLU gate/up
in one launch), 3 y = gelu_tanh(Wx) * (W2 x) (GeGLU). Shapes: w/w2 (rows, row_words), x or xq
(BATCH, ...), res/y (BATCH, rows).
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u16, u32

from .._device import warp_sum
from . import decode8_k as d8
from . import dot_q8 as q8
from . import dot_q8_k as q8k
from . import dot_q8_k_wide as q8kw
from .mxfp4 import dot_q8_MXFP4
from .formats import MXFP4, Q1_0, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q8_0

MAX_BATCH = 8
# The FMT Const: a ggml type id (formats.py) for a format's base kernel, or one of these kernel
# variants (ids of ours, above every ggml id).
# block-pair variants (rows of an even number of 2-byte-aligned blocks, read as u32 words)
Q4_0_PAIR, Q8_0_PAIR = 1002, 1008
# Q6_K rows of an even number of blocks read as u32 words, 4 items per block (dot_q8_k.py)
Q6_K_WORDS = 1014
Q2_K_WIDE = 1110   # Q2_K, 2 items per block, activations by 16-byte loads
Q4_K_WIDE = 1112   # Q4_K, 4 items per block, activations by 8-byte loads
Q3_K_WIDE = 1111   # Q3_K as u32 words, 2 items per block, activations by 16-byte loads
# Q1_0 as u32 words, one item per block, activations by 16-byte loads, bit-plane dots for all
# the group's rows at once (ROWS_PRMT: the same with prmt, GPU only)
Q1_0_ROWS, Q1_0_ROWS_PRMT = 1241, 1341
# the block-pair variants with activations by 8-byte loads
Q4_0_PAIR_VEC, Q8_0_PAIR_VEC = 1202, 1208
MODE_PLAIN, MODE_RESIDUAL, MODE_SWIGLU, MODE_GEGLU = 0, 1, 2, 3


@pk.func
def item_dot_q8(FMT: Const[int], w, wrow: i32, blk: i32, part: i32,
                xq, xstride: i32, acc, a0: i32, BATCH: Const[int]):
    """acc[a0 + bt] += item `part` of block `blk` (row at word wrow) . token bt's Q8_1 row."""
    if FMT == Q4_0:
        q8.dot_q8_Q4_0(w, wrow, blk, part, xq, xstride, acc, a0, BATCH)
    elif FMT == Q4_0_PAIR:
        q8.dot_q8_Q4_0_pair(w, wrow, blk, part, xq, xstride, acc, a0, BATCH, 1)
    elif FMT == Q4_0_PAIR_VEC:
        q8.dot_q8_Q4_0_pair(w, wrow, blk, part, xq, xstride, acc, a0, BATCH, 2)
    elif FMT == Q4_1:
        q8.dot_q8_Q4_1(w, wrow, blk, part, xq, xstride, acc, a0, BATCH)
    elif FMT == Q5_0:
        q8.dot_q8_Q5_0(w, wrow, blk, part, xq, xstride, acc, a0, BATCH)
    elif FMT == Q5_1:
        q8.dot_q8_Q5_1(w, wrow, blk, part, xq, xstride, acc, a0, BATCH)
    elif FMT == Q8_0:
        q8.dot_q8_Q8_0(w, wrow, blk, part, xq, xstride, acc, a0, BATCH)
    elif FMT == Q8_0_PAIR:
        q8.dot_q8_Q8_0_pair(w, wrow, blk, part, xq, xstride, acc, a0, BATCH, 1)
    elif FMT == Q8_0_PAIR_VEC:
        q8.dot_q8_Q8_0_pair(w, wrow, blk, part, xq, xstride, acc, a0, BATCH, 2)
    elif FMT == Q1_0:
        q8.dot_q8_Q1_0(w, wrow, blk, part, xq, xstride, acc, a0, BATCH)
    elif FMT == Q2_K:
        q8k.dot_q8_Q2_K(w, wrow, blk, part, xq, xstride, acc, a0, BATCH)
    elif FMT == Q3_K:
        q8k.dot_q8_Q3_K(w, wrow, blk, part, xq, xstride, acc, a0, BATCH)
    elif FMT == Q4_K:
        q8k.dot_q8_Q4_K(w, wrow, blk, part, xq, xstride, acc, a0, BATCH)
    elif FMT == Q5_K:
        q8k.dot_q8_Q5_K(w, wrow, blk, part, xq, xstride, acc, a0, BATCH)
    elif FMT == Q4_K_WIDE:
        q8kw.dot_q8_Q4_K_wide(w, wrow, blk, part, xq, xstride, acc, a0, BATCH)
    elif FMT == Q3_K_WIDE:
        q8kw.dot_q8_Q3_K_wide(w, wrow, blk, part, xq, xstride, acc, a0, BATCH)
    elif FMT == Q2_K_WIDE:
        q8kw.dot_q8_Q2_K_wide(w, wrow, blk, part, xq, xstride, acc, a0, BATCH)
    elif FMT == Q6_K_WORDS:
        q8k.dot_q8_Q6_K_words(w, wrow, blk, part, xq, xstride, acc, a0, BATCH)
    elif FMT == MXFP4:   # u8 words
        dot_q8_MXFP4(w, wrow, blk, part, xq, xstride, acc, a0, BATCH)
    else:  # Q6_K
        q8k.dot_q8_Q6_K(w, wrow, blk, part, xq, xstride, acc, a0, BATCH)


@pk.func
def rows_item_q8(FMT: Const[int], w, w2, wrows, it: i32,
                 xq, xstride: i32, acc, ITEMS: Const[int], ROWS: Const[int],
                 BATCH: Const[int], MODE: Const[int], WIDEN: Const[int]):
    """Wide item `it` (WIDEN consecutive items) of each of the group's ROWS rows (and of W2's
    rows in the GLU modes)."""
    for v in pk.static_range(WIDEN):
        blk = (it * WIDEN + v) // ITEMS
        part = (it * WIDEN + v) % ITEMS
        if FMT == Q1_0_ROWS or FMT == Q1_0_ROWS_PRMT:   # all rows in one call
            q8.dot_q8_Q1_0_rows(w, w2, wrows, blk, xq, xstride, acc, ROWS, BATCH,
                                MODE >= MODE_SWIGLU, FMT == Q1_0_ROWS_PRMT)
        for ri in pk.static_range(ROWS if FMT != Q1_0_ROWS and FMT != Q1_0_ROWS_PRMT else 0):
            item_dot_q8(FMT, w, wrows[ri], blk, part, xq, xstride, acc, ri * BATCH, BATCH)
            if MODE >= MODE_SWIGLU:
                item_dot_q8(FMT, w2, wrows[ri], blk, part, xq, xstride, acc,
                            (ROWS + ri) * BATCH, BATCH)


@pk.kernel
def gemv_q8_kernel(w: Ptr["WT", "ro"], w2: Ptr["WT", "ro"], xq: Ptr[u32, "ro"], res: Ptr[f32],
                   y: Ptr[f32], rows: i32, row_words: i32, nblocks: i32, xq_words: i32,
                   FMT: Const[int], WT: Const[pk.dtype], ITEMS: Const[int], WARPS: Const[int],
                   BATCH: Const[int], MODE: Const[int], ROWS: Const[int], KW: Const[int],
                   UNROLL: Const[int], WIDEN: Const[int], STAGE_X: Const[int],
                   PREFETCH: Const[bool]):
    prefetch_then_wait(w, w2, pk.block_idx.x * ROWS * (WARPS // KW), ROWS * (WARPS // KW),
                       rows, row_words, WT, MODE, PREFETCH)
    if STAGE_X == 1:   # the block's copy of x in shared memory (dynamic, BATCH * xq_words words)
        xs = pk.dynamic_shared(u32)
        stage_x(xq, xs, BATCH * xq_words, WARPS)
        block_row_groups(w, w2, xs, res, y, rows, row_words, nblocks, xq_words, FMT, ITEMS,
                         WARPS, BATCH, MODE, ROWS, KW, UNROLL, WIDEN)
    else:
        block_row_groups(w, w2, xq, res, y, rows, row_words, nblocks, xq_words, FMT, ITEMS,
                         WARPS, BATCH, MODE, ROWS, KW, UNROLL, WIDEN)


# Under PDL only blocks that can be resident while the previous kernel runs prefetch (132 SMs
# x 32 blocks, the most on today's GPUs): later blocks start after it has finished, so their
# prefetch only queues requests ahead of their own loads. H200, qwen2-1.5B Q4_K_M decode:
# 780 -> 790 tok/s; capping the prefetch to each block's first 4 KB instead cost 3% (760).
FIRST_WAVE_BLOCKS = 132 * 32


@pk.func
def prefetch_then_wait(w, w2, first_row: i32, count: i32, rows: i32, row_words: i32,
                       WT: Const[pk.dtype], MODE: Const[int], PREFETCH: Const[bool]):
    """PREFETCH (launches captured into a PDL graph): the first wave of blocks asks L2 for its
    first weight rows, then waits for the previous kernel, so the weights stream in while it
    finishes. Weights are never written by a kernel, so reading them before the wait is safe.
    Measured on an H200: SmolLM2-shape decode 1472 -> 1594 tok/s; in plain launches the
    prefetch costs 10-20% of a bandwidth-bound GEMV, hence off there."""
    if PREFETCH:
        if pk.block_idx.x < FIRST_WAVE_BLOCKS:
            LINE = 32 if WT == u32 else (64 if WT == u16 else 128)   # words per 128-byte line
            end = min(first_row + count, rows) * row_words
            i = first_row * row_words + pk.thread_idx.x * LINE
            while i < end:
                pk.prefetch_l2(w, i)
                if MODE >= MODE_SWIGLU:
                    pk.prefetch_l2(w2, i)
                i += pk.block_dim.x * LINE
    pk.grid_dependency_wait()


@pk.func
def stage_x(xq: Ptr[u32, "ro"], xs, words: i32, WARPS: Const[int]):
    """Copy words 0..words-1 of xq to shared xs, four loads in flight per thread."""
    step = WARPS * 32
    i = pk.thread_idx.x
    while i + 3 * step < words:
        a = xq[i]
        b = xq[i + step]
        c = xq[i + 2 * step]
        d = xq[i + 3 * step]
        xs[i] = a
        xs[i + step] = b
        xs[i + 2 * step] = c
        xs[i + 3 * step] = d
        i += 4 * step
    while i < words:
        xs[i] = xq[i]
        i += step
    pk.syncthreads()


@pk.func
def block_row_groups(w, w2, xq, res: Ptr[f32], y: Ptr[f32], rows: i32, row_words: i32,
                     nblocks: i32, xq_words: i32, FMT: Const[int], ITEMS: Const[int],
                     WARPS: Const[int], BATCH: Const[int], MODE: Const[int], ROWS: Const[int],
                     KW: Const[int], UNROLL: Const[int], WIDEN: Const[int]):
    """Blocks stride over the row groups (the grid may be smaller than rows / rows per block:
    a persistent grid amortizes staging x, and spreads the rows evenly over the SMs)."""
    per_block = ROWS * (WARPS // KW)
    bgroup = pk.block_idx.x
    while bgroup * per_block < rows:
        rows_dot(w, w2, xq, res, y, rows, row_words, nblocks, xq_words, bgroup, FMT, ITEMS,
                 WARPS, BATCH, MODE, ROWS, KW, UNROLL, WIDEN)
        if KW > 1:   # the next trip reuses the reduction's shared memory
            pk.syncthreads()
        bgroup += pk.grid_dim.x


@pk.func
def rows_dot(w, w2, xq, res: Ptr[f32], y: Ptr[f32], rows: i32, row_words: i32, nblocks: i32,
             xq_words: i32, bgroup: i32, FMT: Const[int], ITEMS: Const[int], WARPS: Const[int],
             BATCH: Const[int], MODE: Const[int], ROWS: Const[int], KW: Const[int],
             UNROLL: Const[int], WIDEN: Const[int]):
    """The ROWS rows of this warp group (of block row group bgroup): dot products, reduction,
    epilogue."""
    acc = pk.local_array(f32, 2 * ROWS * BATCH)   # [0, ROWS*BATCH): W x; then W2 x (GLU)
    for a in pk.static_range(2 * ROWS * BATCH):
        acc[a] = 0.0
    row0 = group_first_row(bgroup, ROWS, WARPS, KW)
    wrows = pk.local_array(i32, ROWS)
    for ri in pk.static_range(ROWS):
        wrows[ri] = min(row0 + ri, rows - 1) * row_words
    pre = pk.local_array(f32, ROWS * BATCH)
    preload_residual(pre, res, rows, row0, KW, ROWS, BATCH, MODE)
    nitems = nblocks * ITEMS // WIDEN   # the host checks that WIDEN divides it
    stride = 32 * KW
    it = pk.thread_idx.x % stride
    while it + (UNROLL - 1) * stride < nitems:   # whole trips: UNROLL items, no bounds checks
        for u in pk.static_range(UNROLL):
            rows_item_q8(FMT, w, w2, wrows, it + u * stride, xq, xq_words, acc, ITEMS, ROWS,
                         BATCH, MODE, WIDEN)
        it += UNROLL * stride
    while it < nitems:
        rows_item_q8(FMT, w, w2, wrows, it, xq, xq_words, acc, ITEMS, ROWS, BATCH, MODE, WIDEN)
        it += stride
    reduce_and_store_pre(acc, pre, y, rows, row0, WARPS, KW, ROWS, BATCH, MODE)


@pk.func
def group_first_row(bgroup: i32, ROWS: Const[int], WARPS: Const[int], KW: Const[int]) -> i32:
    return (bgroup * (WARPS // KW) + pk.thread_idx.x // (32 * KW)) * ROWS


@pk.func
def epilogue(v: f32, v2: f32, res: Ptr[f32], y: Ptr[f32], idx: i32, MODE: Const[int]):
    r = f32(0.0)
    if MODE == MODE_RESIDUAL:
        r = res[idx]
    store_output(v, v2, r, y, idx, MODE)


@pk.func
def store_output(v: f32, v2: f32, r: f32, y: Ptr[f32], idx: i32, MODE: Const[int]):
    """The epilogue with the residual r already loaded (MODE_RESIDUAL; ignored otherwise)."""
    if MODE == MODE_PLAIN:
        y[idx] = v
    elif MODE == MODE_RESIDUAL:
        y[idx] = v + r
    elif MODE == MODE_SWIGLU:
        y[idx] = v / (1.0 + pk.exp(-v)) * v2
    else:  # gelu, tanh approximation (ggml_gelu, gelu_pytorch_tanh)
        inner = 0.7978845608028654 * (v + 0.044715 * v * v * v)
        y[idx] = 0.5 * v * (1.0 + pk.tanh(inner)) * v2


@pk.func
def reduce_and_store(acc, res: Ptr[f32], y: Ptr[f32], rows: i32, row0: i32, WARPS: Const[int],
                     KW: Const[int], ROWS: Const[int], BATCH: Const[int], MODE: Const[int]):
    """Sum each accumulator over the group's threads; lane a of the group's first warp stores
    output a (row row0 + a / BATCH, token a % BATCH), so the stores are spread over lanes."""
    pre = pk.local_array(f32, ROWS * BATCH)
    preload_residual(pre, res, rows, row0, KW, ROWS, BATCH, MODE)
    reduce_and_store_pre(acc, pre, y, rows, row0, WARPS, KW, ROWS, BATCH, MODE)


@pk.func
def preload_residual(pre, res: Ptr[f32], rows: i32, row0: i32, KW: Const[int],
                     ROWS: Const[int], BATCH: Const[int], MODE: Const[int]):
    """MODE_RESIDUAL: pre[a] = the residual of output a, in the lane that will store it
    (reduce_and_store_pre). Loaded before the dot products, its latency is off the kernel's
    tail (res is written by an earlier kernel of the step, complete at the PDL wait; it may
    alias y, whose element only this lane writes, later)."""
    tid = pk.thread_idx.x
    for a in pk.static_range(ROWS * BATCH):
        pre[a] = 0.0
        r = row0 + a // BATCH
        if MODE == MODE_RESIDUAL and (tid // 32) % KW == 0 and tid % 32 == a % 32 and r < rows:
            pre[a] = res[(a % BATCH) * rows + r]


@pk.func
def reduce_and_store_pre(acc, pre, y: Ptr[f32], rows: i32, row0: i32, WARPS: Const[int],
                         KW: Const[int], ROWS: Const[int], BATCH: Const[int],
                         MODE: Const[int]):
    """reduce_and_store with the residuals preloaded (preload_residual)."""
    tid = pk.thread_idx.x
    lane = tid % 32
    for a in pk.static_range(ROWS * BATCH):
        acc[a] = warp_sum(acc[a])
        if MODE >= MODE_SWIGLU:
            acc[ROWS * BATCH + a] = warp_sum(acc[ROWS * BATCH + a])
    if KW > 1:
        red = pk.shared_array(f32, WARPS * 2 * ROWS * BATCH)
        if lane == 0:
            for a in pk.static_range(2 * ROWS * BATCH):
                red[(tid // 32) * 2 * ROWS * BATCH + a] = acc[a]
        pk.syncthreads()
        first = (tid // 32) - (tid // 32) % KW
        for a in pk.static_range(2 * ROWS * BATCH):
            t = f32(0.0)
            for k in pk.static_range(KW):
                t += red[(first + k) * 2 * ROWS * BATCH + a]
            acc[a] = t
    if (tid // 32) % KW == 0:
        for a in pk.static_range(ROWS * BATCH):
            r = row0 + a // BATCH
            if lane == a % 32 and r < rows:
                store_output(acc[a], acc[ROWS * BATCH + a], pre[a], y, (a % BATCH) * rows + r,
                             MODE)


@pk.kernel
def gemv_f32_kernel(w: Ptr["WT", "ro"], w2: Ptr["WT", "ro"], x: Ptr[f32, "ro"], res: Ptr[f32],
                    y: Ptr[f32], rows: i32, row_words: i32, n: i32,
                    FMT: Const[int], WT: Const[pk.dtype], WARPS: Const[int],
                    BATCH: Const[int], MODE: Const[int], KW: Const[int], PREFETCH: Const[bool]):
    # one row per group of KW warps; eight weights decoded per step, applied to every token
    prefetch_then_wait(w, w2, pk.block_idx.x * (WARPS // KW), WARPS // KW, rows, row_words,
                       WT, MODE, PREFETCH)
    acc = pk.local_array(f32, 2 * BATCH)
    for bt in pk.static_range(2 * BATCH):
        acc[bt] = 0.0
    row = group_first_row(pk.block_idx.x, 1, WARPS, KW)
    wrow = min(row, rows - 1) * row_words
    for g in range(pk.thread_idx.x % (32 * KW), n // 8, 32 * KW):
        k = g * 8
        v0, v1, v2, v3, v4, v5, v6, v7 = d8.decode8(FMT, w, wrow, k)
        u0, u1, u2, u3, u4, u5, u6, u7 = v0, v1, v2, v3, v4, v5, v6, v7
        if MODE >= MODE_SWIGLU:
            u0, u1, u2, u3, u4, u5, u6, u7 = d8.decode8(FMT, w2, wrow, k)
        for bt in pk.static_range(BATCH):
            a0, a1, a2, a3 = pk.load_vec(x, bt * n + k, 4)
            a4, a5, a6, a7 = pk.load_vec(x, bt * n + k + 4, 4)
            acc[bt] += (v0 * a0 + v1 * a1 + v2 * a2 + v3 * a3) + \
                (v4 * a4 + v5 * a5 + v6 * a6 + v7 * a7)
            if MODE >= MODE_SWIGLU:
                acc[BATCH + bt] += (u0 * a0 + u1 * a1 + u2 * a2 + u3 * a3) + \
                    (u4 * a4 + u5 * a5 + u6 * a6 + u7 * a7)
    reduce_and_store(acc, res, y, rows, row, WARPS, KW, 1, BATCH, MODE)
