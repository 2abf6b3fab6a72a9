"""Expert GEMV kernels: dot products of one expert's rows of stacked 3-D weights (expert, out,
in; GGUF blocks, flat words) with activation rows, chosen per launch unit on the device.

    moe_gemv_kernel   grid (row groups, units); a unit is one (token, slot) pair (decode:
                      expert ids[unit], input row unit // x_div) or, TILED, one tile of up to
                      BATCH consecutive rows of the grouped order (tiles[3u..3u+2] = expert,
                      first row, row count; input and output rows start at that row).
                      GLU_SILU: y = silu(Wg x + bg) * (Wu x + bu); GLU_OAI (gpt-oss): g =
                      min(Wg x + bg, 7), u = clamp(Wu x + bu, -7, 7), y = g sigmoid(1.702 g)
                      (u + 1); GLU_NONE: y = W x + b. Output row = the unit's row (pairs) or
                      the tile's rows; QOUT (pairs, blocks of 32 rows): the output rows as
                      Q8_1 blocks into yq instead (bit-exact with quantize_q8_1 of them).
    moe_down_kernel   grid (row groups, tokens): y[t] = (res[t] +) sum_j route_w[t, j]
                      (W[ids[t, j]] h[t K + j] + b[ids[t, j]]), the K experts' weighted sum
                      fused into the down projection (j in order, as llama.cpp adds them).
                      A warp reads its rows of all K experts in one pass over the items, so
                      their loads are in flight together (one memory latency, not K).

ACT_Q8: activations as Q8_1 words, weights through the DP4A item dots of gemv_kernels
(item_dot_q8: every GEMV_Q8 format and its variants, the host picks one: experts.py) or
MXFP4_WORDS; ACT_F32: f32 activations, weights
decoded eight at a time (decode8: every GEMV format, F32/F16 included). One warp per row
group of ROWS rows, its lanes striding over the row's items; WARPS row groups per block.
Word offsets are i32: the host checks that the stacked tensor holds < 2^31 words.
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32

from ..quant import gemv_kernels as gk
from ..quant.decode8_k import decode8
from ..quant.mxfp4 import dot_q8_MXFP4_words
from ..quant.q8_1 import store_q8_1_block

ACT_Q8, ACT_F32 = 0, 1
GLU_NONE, GLU_SILU, GLU_OAI = 0, 1, 2
# a kernel variant of ours, beside gemv_kernels' (FMT ids above every ggml id): MXFP4 rows read
# as aligned u32 words (mxfp4.dot_q8_MXFP4_words; wrow stays a byte offset)
MXFP4_WORDS = 1039
OAI_ALPHA, OAI_LIMIT = 1.702, 7.0      # llama.cpp's constants for gpt-oss (not GGUF keys)


@pk.func
def expert_item(FMT: Const[int], w, wrow: i32, blk: i32, part: i32, xq, xstride: i32, acc,
                a0: i32, BATCH: Const[int]):
    """acc[a0 + bt] += item `part` of block `blk` of the row at wrow . Q8_1 row bt (the
    item_dot_q8 contract of gemv_kernels), with this module's variants."""
    if FMT == MXFP4_WORDS:
        dot_q8_MXFP4_words(w, wrow, blk, part, xq, xstride, acc, a0, BATCH)
    else:
        gk.item_dot_q8(FMT, w, wrow, blk, part, xq, xstride, acc, a0, BATCH)


@pk.func
def expert_dots(FMT: Const[int], w, w2, x, xstride: i32, xstep: i32, wrows, acc, nblocks: i32,
                n: i32, ACT: Const[int], ITEMS: Const[int], NR: Const[int], GROUP: Const[int],
                BATCH: Const[int], GLU: Const[int]):
    """This lane's share of acc[r BATCH + bt] += W[row r] . x_r[bt] for the NR rows at wrows
    (and of W2 . x_r at (NR + r) BATCH + bt when GLU), x_r = x + (r // GROUP) xstep holding
    BATCH rows of xstride words. One loop over the items with every row's item inside, so
    the loads of all NR rows (the down projection: all K experts) are in flight together."""
    lane = pk.thread_idx.x % 32
    if ACT == ACT_Q8:
        it = lane
        while it < nblocks * ITEMS:
            blk = it // ITEMS
            part = it % ITEMS
            for r in pk.static_range(NR):
                xr = x + (r // GROUP) * xstep
                expert_item(FMT, w, wrows[r], blk, part, xr, xstride, acc, r * BATCH, BATCH)
                if GLU != GLU_NONE:
                    expert_item(FMT, w2, wrows[r], blk, part, xr, xstride, acc,
                                (NR + r) * BATCH, BATCH)
            it += 32
    else:
        for g in range(lane, n // 8, 32):
            for r in pk.static_range(NR):
                xr = x + (r // GROUP) * xstep
                f32_row_step(FMT, w, wrows[r], xr, xstride, g * 8, acc, r * BATCH, BATCH)
                if GLU != GLU_NONE:
                    f32_row_step(FMT, w2, wrows[r], xr, xstride, g * 8, acc,
                                 (NR + r) * BATCH, BATCH)


@pk.func
def f32_row_step(FMT: Const[int], w, wrow: i32, x, xstride: i32, k: i32, acc, a0: i32,
                 BATCH: Const[int]):
    v0, v1, v2, v3, v4, v5, v6, v7 = decode8(FMT, w, wrow, k)
    for bt in pk.static_range(BATCH):
        a0_, a1, a2, a3 = pk.load_vec(x, bt * xstride + k, 4)
        a4, a5, a6, a7 = pk.load_vec(x, bt * xstride + k + 4, 4)
        acc[a0 + bt] += (v0 * a0_ + v1 * a1 + v2 * a2 + v3 * a3) + \
            (v4 * a4 + v5 * a5 + v6 * a6 + v7 * a7)


@pk.func
def glu(g: f32, u: f32, GLU: Const[int]) -> f32:
    if GLU == GLU_SILU:
        return g / (1.0 + pk.exp(-g)) * u
    gc = min(g, OAI_LIMIT)
    uc = min(max(u, -OAI_LIMIT), OAI_LIMIT)
    return gc / (1.0 + pk.exp(OAI_ALPHA * -gc)) * (uc + 1.0)


@pk.func
def expert_rows(e: i32, rows: i32, row_words: i32, row0: i32, wrows, ROWS: Const[int]):
    """wrows[ri] = first word of expert e's row row0 + ri (clamped to its last row)."""
    for ri in pk.static_range(ROWS):
        wrows[ri] = (e * rows + min(row0 + ri, rows - 1)) * row_words


@pk.kernel
def moe_gemv_kernel(w: Ptr["WT", "ro"], w2: Ptr["WT", "ro"], x: Ptr["XT", "ro"],
                    bias: Ptr[f32, "ro"], bias2: Ptr[f32, "ro"], ids: Ptr[i32, "ro"],
                    tiles: Ptr[i32, "ro"], y: Ptr[f32], yq: Ptr[u32], rows: i32,
                    row_words: i32, nblocks: i32, n: i32, x_words: i32, x_div: i32,
                    FMT: Const[int], WT: Const[pk.dtype], XT: Const[pk.dtype], ACT: Const[int],
                    ITEMS: Const[int], WARPS: Const[int], ROWS: Const[int], BATCH: Const[int],
                    GLU: Const[int], HAS_BIAS: Const[bool], TILED: Const[bool],
                    QOUT: Const[bool]):
    # QOUT (pairs, WARPS ROWS == 32, rows % 32 == 0): the block's 32 output rows meet in
    # shared memory and leave as one Q8_1 block of yq (the down projection's input) instead
    # of f32 rows of y: the same bits as quantize_q8_1 of them, one launch fewer
    hs = pk.shared_array(f32, WARPS * ROWS if QOUT else 1)
    unit = pk.block_idx.y
    e = i32(0)
    first = unit
    count = 1
    in_row = unit // x_div
    if TILED:
        e = tiles[3 * unit]
        first = tiles[3 * unit + 1]
        count = tiles[3 * unit + 2]
        in_row = first
    else:
        e = ids[unit]
    row0 = (pk.block_idx.x * WARPS + pk.thread_idx.x // 32) * ROWS
    if count > 0 and row0 < rows:
        wrows = pk.local_array(i32, ROWS)
        expert_rows(e, rows, row_words, row0, wrows, ROWS)
        acc = pk.local_array(f32, 2 * ROWS * BATCH)
        for a in pk.static_range(2 * ROWS * BATCH):
            acc[a] = 0.0
        expert_dots(FMT, w, w2, x + in_row * x_words, x_words, 0, wrows, acc, nblocks, n, ACT,
                    ITEMS, ROWS, ROWS, BATCH, GLU)
        store_rows(acc, bias, bias2, y, hs, e, rows, row0, first, count, ROWS, BATCH, GLU,
                   HAS_BIAS, QOUT, WARPS)
    if QOUT:
        pk.syncthreads()
        lane = pk.thread_idx.x
        if lane < 32:
            store_q8_1_block(hs[lane], lane, yq, unit * (rows // 32) + pk.block_idx.x)


@pk.func
def store_rows(acc, bias: Ptr[f32, "ro"], bias2: Ptr[f32, "ro"], y: Ptr[f32], hs, e: i32,
               rows: i32, row0: i32, first: i32, count: i32, ROWS: Const[int],
               BATCH: Const[int], GLU: Const[int], HAS_BIAS: Const[bool], QOUT: Const[bool],
               WARPS: Const[int]):
    """Sum the lanes' shares, add the biases, apply the GLU; out to y's rows (or to the
    block's shared rows hs, QOUT)."""
    lane = pk.thread_idx.x % 32
    for a in pk.static_range(ROWS * BATCH):
        v = gk.warp_sum(acc[a])
        v2 = gk.warp_sum(acc[ROWS * BATCH + a]) if GLU != GLU_NONE else f32(0.0)
        r = row0 + a // BATCH
        bt = a % BATCH
        if lane == a % 32 and r < rows and bt < count:
            if HAS_BIAS:
                v += bias[e * rows + r]
                if GLU != GLU_NONE:
                    v2 += bias2[e * rows + r]
            out = glu(v, v2, GLU) if GLU != GLU_NONE else v
            if QOUT:
                hs[r - pk.block_idx.x * WARPS * ROWS] = out
            else:
                y[(first + bt) * rows + r] = out


@pk.kernel
def moe_down_kernel(w: Ptr["WT", "ro"], x: Ptr["XT", "ro"], bias: Ptr[f32, "ro"],
                    ids: Ptr[i32, "ro"], route_w: Ptr[f32, "ro"], res: Ptr[f32], y: Ptr[f32],
                    rows: i32, row_words: i32, nblocks: i32, n: i32, x_words: i32,
                    FMT: Const[int], WT: Const[pk.dtype], XT: Const[pk.dtype],
                    ACT: Const[int], ITEMS: Const[int], WARPS: Const[int], ROWS: Const[int],
                    K: Const[int], HAS_BIAS: Const[bool], HAS_RES: Const[bool]):
    # a warp's ROWS rows of all K experts in one pass over the items (K ROWS rows in flight),
    # then the weighted sum in slot order j
    t = pk.block_idx.y
    row0 = (pk.block_idx.x * WARPS + pk.thread_idx.x // 32) * ROWS
    if row0 < rows:
        experts = pk.local_array(i32, K)
        wrows = pk.local_array(i32, K * ROWS)
        for j in pk.static_range(K):
            experts[j] = ids[t * K + j]
            for ri in pk.static_range(ROWS):
                wrows[j * ROWS + ri] = (experts[j] * rows + min(row0 + ri, rows - 1)) * \
                    row_words
        acc = pk.local_array(f32, K * ROWS)
        for a in pk.static_range(K * ROWS):
            acc[a] = 0.0
        expert_dots(FMT, w, w, x + t * K * x_words, x_words, x_words, wrows, acc, nblocks, n,
                    ACT, ITEMS, K * ROWS, ROWS, 1, GLU_NONE)
        total = pk.local_array(f32, ROWS)
        for j in pk.static_range(K):
            weight = route_w[t * K + j]
            for ri in pk.static_range(ROWS):
                v = gk.warp_sum(acc[j * ROWS + ri])
                if HAS_BIAS:
                    v += bias[experts[j] * rows + min(row0 + ri, rows - 1)]
                total[ri] = weight * v if j == 0 else total[ri] + weight * v
        lane = pk.thread_idx.x % 32
        for ri in pk.static_range(ROWS):
            r = row0 + ri
            if lane == ri % 32 and r < rows:
                out = total[ri]
                if HAS_RES:
                    out = res[t * rows + r] + out
                y[t * rows + r] = out
