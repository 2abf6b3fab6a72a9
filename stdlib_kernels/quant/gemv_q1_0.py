"""Q1_0 decode GEMV on binary tensor cores: y[b, r] = sum_k W[r, k] x[b, k] for 1..8 tokens,
W in GGUF Q1_0 rows, x as Q8 planes (q8_planes.py).

    gemv_q1_0_into(w, xp, y, rows, n, batch, w2=, res=, mode=)   preallocated, graph-capturable
    bmma_available()          True on the CPU target and CUDA devices of sm_80 or newer
    gemv_q1_0_kernel          one `mma.m16n8k128.b1.and.popc` per 16 rows x 128 values x token

Per Q1_0 block (128 values: d_w and sign bits, value = bit ? +d_w : -d_w) and Q8-planes group
(d_x, int8 q, s = d_x sum(q)): sum_k w_k x_k ~ d_w d_x (2 sum_{bit set} q_k - sum q_k), and
sum_{bit set} q_k = sum_p c_p C[p], C[p] = popc(bits AND plane p), c_p = 2^p (p < 7), -128 (p = 7).
The mma's A = 16 rows' bits of one block (lane 4 g + t: row g's bits word t in a0, row g + 8's
in a1, plain words of the block), B = the group's 8 planes (column p = plane p; lane 4 g + t
reads plane word 4 g + t), so lane (g, t) gets C[p] for p = 2t, 2t + 1 of rows g and g + 8 and
adds d_w (d_x (2 c_2t C[2t] + 2 c_2t+1 C[2t+1]) - s / 4): the quad's 4 lanes together hold the
row's dot with the block. Quads reduce with 2 shuffles at the end.

Geometry: a warp owns TILES tiles of 16 rows; KW warps split each row's items; a block holds
WARPS / KW tile groups. STAGE = S >= 2 (rows of a multiple of 8 blocks, w and w2): each warp
streams 8-block chunks of its rows through a ring of S stages in shared memory, copied by
`pk.cp_async` (coalesced 16 bytes, no register round trip; S - 1 chunks in flight) and waited
on per warp only, and reads the fragments there (direct 4-byte fragment loads touch 8 rows per
instruction: 44% of copy bandwidth; a register-staged copy with a block barrier per chunk
61-68%; the ring 65-73%, H200). BULK = CB (sm_90+, the default for weights over L2): the
ring's chunks are CB blocks per row, one `pk.bulk_copy` per row, waited on through mbarriers
(82% of copy at 128256 x 4096 with one warp per block, 2 stages of whole rows). Otherwise
direct loads: u32 rows, items = block pairs (9
words); u16 rows (odd block counts), single blocks; UNROLL items' loads issued before their
mmas. Rows past the end are clamped for the loads and not stored. MODE: as gemv_kernels
(0 plain, 1 + res, 2 swiglu, 3 geglu with W2 = up rows). Shapes: w/w2 (rows, row_words), xp
(BATCH, 34 n/128 words), res/y (BATCH, rows).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f16, f32, i32, u16, u32, u64

from .gemv_kernels import (MAX_BATCH, MODE_GEGLU, MODE_PLAIN, MODE_RESIDUAL, MODE_SWIGLU,
                           epilogue, prefetch_then_wait)
from .q8_planes import GROUP_WORDS


@pk.func
def half_at(word: u32, high: Const[bool]) -> f32:
    """The f16 in the low (or high) half of a word, as f32."""
    if high:
        return f32(pk.bitcast(u16(word >> u32(16)), f16))
    return f32(pk.bitcast(u16(word & u32(0xFFFF)), f16))


@pk.func
def pair_words(w, p: i32, t: i32):
    """The block pair at word p of u32 words w (global rows or the shared stage; 36 bytes = 9
    words: d0 | bits0 from byte 2 | d1 at byte 18 | bits1 from byte 20): (d0, bits0 word t, d1,
    bits1 word t)."""
    lo = w[p + t]
    hi = w[p + t + 1]
    first = w[p]
    mid = w[p + 4]
    bits1 = w[p + 5 + t]
    return half_at(first, False), (lo >> u32(16)) | (hi << u32(16)), half_at(mid, True), bits1


@pk.func
def block_words(w: Ptr[u16, "ro"], wrow: i32, blk: i32, t: i32):
    """Block blk of a u16-word row (9 u16): (d, bits word t)."""
    b = wrow + 9 * blk
    return f32(pk.bitcast(w[b], f16)), u32(w[b + 1 + 2 * t]) | (u32(w[b + 2 + 2 * t]) << u32(16))


@pk.func
def load_b(xp: Ptr[u32, "ro"], blk: i32, lane: i32, xrow: i32, groups: i32, bw, dx, sx4,
           o: Const[int], BATCH: Const[int]):
    """[o + bt] = token bt's plane word for this lane (the B fragment), d_x and -s/4 of group
    blk."""
    for bt in pk.static_range(BATCH):
        bw[o + bt] = xp[bt * xrow + 32 * blk + lane]
        d, s = pk.load_vec(xp, bt * xrow + 32 * groups + 2 * blk, 2)
        dx[o + bt] = pk.bitcast(d, f32)
        sx4[o + bt] = -0.25 * pk.bitcast(s, f32)


@pk.func
def block_mma(a_lo: u32, a_hi: u32, d_lo: f32, d_hi: f32, bw, dx, sx4, o: Const[int],
              we: f32, wo: i32, acc, a0: i32, BATCH: Const[int]):
    """acc[a0 + 2 bt] (row g) and acc[a0 + 2 bt + 1] (row g + 8) += this lane's share of the
    rows' dot with token bt's group (B operands at [o + bt]): 2 c_2t C[2t] + 2 c_2t+1 C[2t+1] =
    we (C[2t] + wo C[2t+1]) with we = 2 c_2t a power of two (exact in f32), wo = +-2."""
    for bt in pk.static_range(BATCH):
        c0, c1, c2, c3 = pk.mma_m16n8k128_b1(a_lo, a_hi, bw[o + bt], 0, 0, 0, 0)
        dxs = dx[o + bt] * we
        acc[a0 + 2 * bt] = pk.fma(d_lo, pk.fma(dxs, f32(c0 + c1 * wo), sx4[o + bt]),
                                  acc[a0 + 2 * bt])
        acc[a0 + 2 * bt + 1] = pk.fma(d_hi, pk.fma(dxs, f32(c2 + c3 * wo), sx4[o + bt]),
                                      acc[a0 + 2 * bt + 1])


@pk.func
def load_frags(w, wrow: i32, it: i32, t: i32, fa, fd, f: i32, NB: Const[int]):
    """Bits word t and d of item it's NB blocks of one row into fa/fd[f + 2 blk]."""
    if NB == 2:
        d0, a0, d1, a1 = pair_words(w, wrow + 9 * it, t)
        fa[f] = a0
        fd[f] = d0
        fa[f + 2] = a1
        fd[f + 2] = d1
    else:
        d, a = block_words(w, wrow, it, t)
        fa[f] = a
        fd[f] = d


@pk.func
def load_item(w, w2, wrows, it: i32, xp: Ptr[u32, "ro"], xrow: i32, groups: i32, lane: i32,
              fa, fd, bw, dx, sx4, s: Const[int], NB: Const[int], NW: Const[int],
              TILES: Const[int], BATCH: Const[int]):
    """All loads of item `it` (NB = 2: a block pair of u32 rows; 1: a block of u16 rows) into
    slot s: its groups' activations (bw/dx/sx4[(s NB + blk) BATCH + bt]) and its blocks'
    fragments in every tile of w and, NW = 2, of w2 (fa/fd[(((s NW + m) TILES + j) NB + blk)
    2 + half], half 0: row g, 1: row g + 8)."""
    t = lane % 4
    for blk in pk.static_range(NB):
        load_b(xp, NB * it + blk, lane, xrow, groups, bw, dx, sx4, (s * NB + blk) * BATCH,
               BATCH)
    for m in pk.static_range(NW):
        for j in pk.static_range(TILES):
            for half in pk.static_range(2):
                f = ((s * NW + m) * TILES + j) * NB * 2 + half
                if m == 0:
                    load_frags(w, wrows[2 * j + half], it, t, fa, fd, f, NB)
                else:
                    load_frags(w2, wrows[2 * j + half], it, t, fa, fd, f, NB)


@pk.func
def mma_item(fa, fd, bw, dx, sx4, s: Const[int], we: f32, wo: i32, acc, NB: Const[int],
             NW: Const[int], TILES: Const[int], BATCH: Const[int]):
    """The mmas of the item loaded in slot s: acc[2 (m TILES + j) BATCH + 2 bt + half]."""
    for m in pk.static_range(NW):
        for j in pk.static_range(TILES):
            for blk in pk.static_range(NB):
                f = (((s * NW + m) * TILES + j) * NB + blk) * 2
                block_mma(fa[f], fa[f + 1], fd[f], fd[f + 1], bw, dx, sx4,
                          (s * NB + blk) * BATCH, we, wo, acc, 2 * (m * TILES + j) * BATCH,
                          BATCH)


@pk.kernel
def gemv_q1_0_kernel(w: Ptr["WT", "ro"], w2: Ptr["WT", "ro"], xp: Ptr[u32, "ro"],
                     res: Ptr[f32], y: Ptr[f32], rows: i32, row_words: i32, nitems: i32,
                     groups: i32, WT: Const[pk.dtype], NB: Const[int], NW: Const[int],
                     WARPS: Const[int], KW: Const[int], TILES: Const[int], UNROLL: Const[int],
                     BATCH: Const[int], MODE: Const[int], STAGE: Const[int],
                     PREFETCH: Const[bool], BULK: Const[int]):
    per_block = 16 * TILES * (WARPS // KW)
    prefetch_then_wait(w, w2, pk.block_idx.x * per_block, per_block, rows, row_words, WT, MODE,
                       PREFETCH)
    lane = pk.lane_id()
    warp = pk.thread_idx.x // 32
    row0 = pk.block_idx.x * per_block + (warp // KW) * 16 * TILES
    wrows = pk.local_array(i32, 2 * TILES)
    for j in pk.static_range(2 * TILES):      # rows g and g + 8 of each tile
        wrows[j] = min(row0 + 8 * j + lane // 4, rows - 1) * row_words
    acc = pk.local_array(f32, 4 * TILES * BATCH)   # [W: tile, row half, token], W2's
    for a in pk.static_range(4 * TILES * BATCH):
        acc[a] = 0.0
    t = lane % 4
    we = f32(i32(2) << (2 * t))                 # 2 c_2t (the factor 2 folded in)
    wo = i32(2) if t < 3 else i32(-2)           # c_2t+1 / c_2t
    if BULK > 0:
        bulk_loop(w, w2, xp, rows, row_words, groups, row0, warp, lane, acc, we, wo, NW, KW,
                  TILES, STAGE, BATCH, WARPS, BULK)
    elif STAGE > 1:
        ring_loop(w, w2, xp, rows, row_words, groups, row0, warp, lane, acc, we, wo, NW, KW,
                  TILES, STAGE, BATCH)
    else:
        direct_loop(w, w2, wrows, xp, nitems, groups, warp, lane, acc, we, wo, NB, NW, KW,
                    TILES, UNROLL, BATCH)
    reduce_and_store(acc, res, y, rows, row0, WARPS, KW, TILES, BATCH, MODE)


@pk.func
def direct_loop(w, w2, wrows, xp: Ptr[u32, "ro"], nitems: i32, groups: i32, warp: i32,
                lane: i32, acc, we: f32, wo: i32, NB: Const[int], NW: Const[int], KW: Const[int],
                TILES: Const[int], UNROLL: Const[int], BATCH: Const[int]):
    """Fragments loaded straight from the weight rows (4-byte loads: 16 bytes per row and
    instruction), UNROLL items' loads issued before their mmas."""
    fa = pk.local_array(u32, UNROLL * NW * TILES * NB * 2)
    fd = pk.local_array(f32, UNROLL * NW * TILES * NB * 2)
    bw = pk.local_array(u32, UNROLL * NB * BATCH)
    dx = pk.local_array(f32, UNROLL * NB * BATCH)
    sx4 = pk.local_array(f32, UNROLL * NB * BATCH)
    xrow = 34 * groups
    it = warp % KW
    while it + (UNROLL - 1) * KW < nitems:   # whole trips: all UNROLL items' loads, then mmas
        for u in pk.static_range(UNROLL):
            load_item(w, w2, wrows, it + u * KW, xp, xrow, groups, lane, fa, fd, bw, dx, sx4,
                      u, NB, NW, TILES, BATCH)
        for u in pk.static_range(UNROLL):
            mma_item(fa, fd, bw, dx, sx4, u, we, wo, acc, NB, NW, TILES, BATCH)
        it += UNROLL * KW
    while it < nitems:
        load_item(w, w2, wrows, it, xp, xrow, groups, lane, fa, fd, bw, dx, sx4, 0, NB, NW,
                  TILES, BATCH)
        mma_item(fa, fd, bw, dx, sx4, 0, we, wo, acc, NB, NW, TILES, BATCH)
        it += KW


# The ring (STAGE = S >= 2): a chunk = 8 blocks = 36 words = 9 16-byte vectors per row; stage
# row q holds chunk words of the warp's 16 TILES rows of w, then (GLU) of w2. Lane (g, t) reads
# fragment word 36 g + 9 q + t: bank 4 g + t + const, no conflicts. Rounds are block-uniform (a
# warp without a chunk in the last round only copies); every wait is the warp's own.
@pk.func
def ring_loop(w: Ptr[u32, "ro"], w2: Ptr[u32, "ro"], xp: Ptr[u32, "ro"], rows: i32,
              row_words: i32, groups: i32, row0: i32, warp: i32, lane: i32, acc, we: f32,
              wo: i32, NW: Const[int], KW: Const[int], TILES: Const[int], S: Const[int],
              BATCH: Const[int]):
    sm = pk.dynamic_shared(u32)
    SW = 576 * NW * TILES                     # words per stage: 16 NW TILES rows x 36
    base = warp * S * SW
    nchunks = groups // 8
    rounds = (nchunks + KW - 1) // KW         # block-uniform; a warp past the end copies only
    first = warp % KW
    for s in pk.static_range(S - 1):
        if s < rounds:
            ring_copy(w, w2, sm, base + s * SW, row0, rows, row_words,
                      min(first + KW * s, nchunks - 1), lane, NW, TILES)
        pk.cp_async_commit()
    for r in range(rounds):
        ahead = r + S - 1
        if ahead < rounds:
            ring_copy(w, w2, sm, base + ahead % S * SW, row0, rows, row_words,
                      min(first + KW * ahead, nchunks - 1), lane, NW, TILES)
        pk.cp_async_commit()
        pk.cp_async_wait(S - 1)               # this lane's copies of chunk r have landed
        pk.syncwarp()                         # ... and every lane's
        if first + KW * r < nchunks:
            chunk_dot(sm, base + r % S * SW, first + KW * r, xp, groups, lane, acc, we, wo, NW,
                      TILES, BATCH, 36)
        pk.syncwarp()                         # stage r % S is read before it is refilled


# The copy addresses are recomputed per chunk: precomputing them per lane (-60 of ~300 SASS
# instructions per chunk) measured slower on the H200 at 1 token and 2 stages (13.8 vs
# 12.8 us at 57344 x 4096; faster at 8 tokens), so the per-chunk form stays.
@pk.func
def ring_copy(w: Ptr[u32, "ro"], w2: Ptr[u32, "ro"], sm, stage: i32, row0: i32, rows: i32,
              row_words: i32, chunk: i32, lane: i32, NW: Const[int], TILES: Const[int]):
    """Chunk `chunk` of the warp's rows to the stage: vector v = lane + 32 i (past the end: the
    last one again) is stage row v // 9 (w's 16 TILES rows, then w2's), words 4 (v % 9)..+3."""
    V = 144 * NW * TILES
    for i in pk.static_range((V + 31) // 32):
        v = min(lane + 32 * i, V - 1)
        srow = v // 9
        src = min(row0 + srow % (16 * TILES), rows - 1) * row_words + 36 * chunk + 4 * (v % 9)
        if srow < 16 * TILES:
            pk.cp_async(sm, stage + 4 * v, w, src)
        else:
            pk.cp_async(sm, stage + 4 * v, w2, src)


@pk.func
def chunk_dot(sm, buf: i32, chunk: i32, xp: Ptr[u32, "ro"], groups: i32, lane: i32, acc,
              we: f32, wo: i32, NW: Const[int], TILES: Const[int], BATCH: Const[int],
              RS: Const[int]):
    """The staged 8-block chunk's 4 block pairs (stage rows of RS words: 16 TILES of w, then
    w2's): all shared loads, then the mmas."""
    t = lane % 4
    fa = pk.local_array(u32, 16 * NW * TILES)     # [pair q, matrix tile, block, row half]
    fd = pk.local_array(f32, 16 * NW * TILES)
    bw = pk.local_array(u32, 8 * BATCH)
    dx = pk.local_array(f32, 8 * BATCH)
    sx4 = pk.local_array(f32, 8 * BATCH)
    for q in pk.static_range(4):
        for blk in pk.static_range(2):
            load_b(xp, 8 * chunk + 2 * q + blk, lane, 34 * groups, groups, bw, dx, sx4,
                   (2 * q + blk) * BATCH, BATCH)
        for j in pk.static_range(NW * TILES):
            for half in pk.static_range(2):
                f = (q * NW * TILES + j) * 4 + half
                d0, a0, d1, a1 = pair_words(sm, buf + (16 * j + 8 * half + lane // 4) * RS +
                                            9 * q, t)
                fa[f] = a0
                fd[f] = d0
                fa[f + 2] = a1
                fd[f + 2] = d1
    for q in pk.static_range(4):
        for j in pk.static_range(NW * TILES):
            for blk in pk.static_range(2):
                f = ((q * NW * TILES + j) * 2 + blk) * 2
                block_mma(fa[f], fa[f + 1], fd[f], fd[f + 1], bw, dx, sx4, (2 * q + blk) * BATCH,
                          we, wo, acc, 2 * j * BATCH, BATCH)


# The bulk ring (BULK = CB blocks per chunk, a multiple of 8; STAGE = S >= 1 stages): stage row
# q = one `pk.bulk_copy` of the row's 18 CB chunk bytes (lane q issues it), rows RS words apart
# (RS % 32 an odd multiple of 4: lane (g, t) reads bank 8 g' + t + const, no conflicts); lane 0
# announces the stage's bytes on its mbarrier, and every lane waits on the phase (no cp.async
# groups, no per-lane address math beyond one row per lane).
def bulk_row_words(cb: int) -> int:
    return 36 * (cb // 8) + 4 * (1 - (cb // 8) % 2)


@pk.func
def bulk_loop(w: Ptr[u32, "ro"], w2: Ptr[u32, "ro"], xp: Ptr[u32, "ro"], rows: i32,
              row_words: i32, groups: i32, row0: i32, warp: i32, lane: i32, acc, we: f32,
              wo: i32, NW: Const[int], KW: Const[int], TILES: Const[int], S: Const[int],
              BATCH: Const[int], WARPS: Const[int], CB: Const[int]):
    sm = pk.dynamic_shared(u32)
    bars = pk.shared_array(u64, WARPS * S)
    RS = 36 * (CB // 8) + 4 * (1 - (CB // 8) % 2)     # bulk_row_words(CB)
    SW = RS * 16 * NW * TILES                 # words per stage
    base = warp * S * SW
    if lane == 0:
        for s in pk.static_range(S):
            pk.mbarrier_init(bars, warp * S + s, 1)
        pk.fence_mbarrier_init()
    pk.syncwarp()
    nchunks = groups // CB
    rounds = (nchunks + KW - 1) // KW         # block-uniform; a warp past the end copies only
    first = warp % KW
    for s in pk.static_range(S - 1):
        if s < rounds:
            bulk_issue(w, w2, sm, bars, warp * S + s, base + s * SW, row0, rows, row_words,
                       min(first + KW * s, nchunks - 1), lane, NW, TILES, CB, RS)
    for r in range(rounds):
        ahead = r + S - 1
        if ahead < rounds:
            bulk_issue(w, w2, sm, bars, warp * S + ahead % S, base + ahead % S * SW, row0,
                       rows, row_words, min(first + KW * ahead, nchunks - 1), lane, NW, TILES,
                       CB, RS)
        pk.mbarrier_wait(bars, warp * S + r % S, (r // S) % 2)
        if first + KW * r < nchunks:
            for sub in pk.static_range(CB // 8):
                chunk_dot(sm, base + r % S * SW + 36 * sub, (CB // 8) * (first + KW * r) + sub,
                          xp, groups, lane, acc, we, wo, NW, TILES, BATCH, RS)
        pk.syncwarp()                         # stage r % S is read before it is refilled


@pk.func
def bulk_issue(w: Ptr[u32, "ro"], w2: Ptr[u32, "ro"], sm, bars, bar: i32, stage: i32,
               row0: i32, rows: i32, row_words: i32, chunk: i32, lane: i32, NW: Const[int],
               TILES: Const[int], CB: Const[int], RS: Const[int]):
    """Chunk `chunk` (CB blocks) of the warp's 16 TILES rows (then w2's) into the stage: lane
    q copies stage row q (rows past the end: the last row again)."""
    R = 16 * NW * TILES
    if lane == 0:
        pk.mbarrier_arrive_expect_tx(bars, bar, 18 * CB * R)
    for i in pk.static_range((R + 31) // 32):
        srow = lane + 32 * i
        if srow < R:
            src = min(row0 + srow % (16 * TILES), rows - 1) * row_words + 9 * CB // 2 * chunk
            if srow < 16 * TILES:
                pk.bulk_copy(sm, stage + RS * srow, w, src, 18 * CB, bars, bar)
            else:
                pk.bulk_copy(sm, stage + RS * srow, w2, src, 18 * CB, bars, bar)


@pk.func
def reduce_and_store(acc, res: Ptr[f32], y: Ptr[f32], rows: i32, row0: i32, WARPS: Const[int],
                     KW: Const[int], TILES: Const[int], BATCH: Const[int], MODE: Const[int]):
    """Sum each accumulator over its quad (2 shuffles), then over the KW warps of the tile
    group (shared memory); lane 4 g of the group's first warp stores rows g and g + 8."""
    lane = pk.lane_id()
    warp = pk.thread_idx.x // 32
    quad_sum(acc, 0, 2 * TILES * BATCH)
    if MODE >= MODE_SWIGLU:
        quad_sum(acc, 2 * TILES * BATCH, 2 * TILES * BATCH)
    if KW > 1:
        red = pk.shared_array(f32, WARPS * 8 * 4 * TILES * BATCH)
        if lane % 4 == 0:
            for a in pk.static_range(4 * TILES * BATCH):
                red[(warp * 8 + lane // 4) * 4 * TILES * BATCH + a] = acc[a]
        pk.syncthreads()
        first = warp - warp % KW
        for a in pk.static_range(4 * TILES * BATCH):
            total = f32(0.0)
            for k in pk.static_range(KW):
                total += red[((first + k) * 8 + lane // 4) * 4 * TILES * BATCH + a]
            acc[a] = total
    if warp % KW == 0 and lane % 4 == 0:
        for j in pk.static_range(TILES):
            for half in pk.static_range(2):
                r = row0 + 16 * j + 8 * half + lane // 4
                for bt in pk.static_range(BATCH):
                    a = (2 * j * BATCH) + 2 * bt + half
                    if r < rows:
                        epilogue(acc[a], acc[2 * TILES * BATCH + a], res, y, bt * rows + r, MODE)


@pk.func
def quad_sum(acc, a0: Const[int], COUNT: Const[int]):
    for a in pk.static_range(COUNT):
        acc[a0 + a] += pk.shfl_xor(acc[a0 + a], 1)
        acc[a0 + a] += pk.shfl_xor(acc[a0 + a], 2)


class Q1Config(NamedTuple):
    """Launch shape: `warps` per thread block, `split` warps sharing each tile group's items
    (K split; > 1 adds a shared-memory reduction), `tiles` 16-row tiles per warp (they share
    the activation loads), `unroll` items per loop trip (direct loads), `stage` S >= 2 (rows
    of a multiple of 8 blocks): a cp.async ring of S chunks per warp; 0 (and other rows):
    fragments loaded straight from the rows. `bulk` CB > 0 (sm_90+, a multiple of 8 dividing
    the row's blocks): the ring's chunks are CB blocks, one `pk.bulk_copy` per row and chunk,
    waited on through mbarriers (stage S >= 1)."""
    warps: int = 4
    split: int = 1
    tiles: int = 1
    unroll: int = 2
    stage: int = 2
    bulk: int = 0


# fastest measured on an H200 (benchmarks/RESULTS.md, "Q1_0 on binary tensor cores"): rows up
# to SHORT_ROW values (57344 / 128256 x 4096), longer rows (4096 x 14336: the K split); at 8
# tokens and long rows direct loads (the staged kernels' registers); ring of 2 stages: 12.75 /
# 25.4 / 5.45 us at 57344 / 128256 x 4096 and 4096 x 14336 (register stages: 13.8 / 27.5 / 5.8)
# Weights over the L2 (1 token, rows of a multiple of 32 blocks, sm_90+): one warp per block,
# whole rows (32-block chunks) through a 2-stage bulk-copy ring, 22.8 vs 25.3 us (82 vs 74% of
# copy) at 128256 x 4096; at 57344 x 4096 (33 MB, in L2 reach) it ties with the cp.async ring
# (12.57 vs 12.56 us). H200, "Q1_0 BMMA: bulk copies" in benchmarks/RESULTS.md.
SHORT_ROW = 8192
SHORT_CONFIG = Q1Config(4, 1, 1, 1, 2)
OVER_L2_CONFIG = Q1Config(1, 1, 1, 1, 2, 32)
L2_BYTES = 50 << 20
LONG_CONFIG = Q1Config(14, 14, 1, 1, 2)
LONG_BATCH_CONFIG = Q1Config(8, 8, 1, 2, 0)   # more than 2 tokens
CPU_CONFIG = Q1Config(2, 1, 1, 1, 3)
MAX_SHARED = 227 << 10    # bytes per block (H100 / H200 opt-in limit)
MODES = {None: MODE_PLAIN, "residual": MODE_RESIDUAL, "swiglu": MODE_SWIGLU,
         "geglu": MODE_GEGLU}


def bmma_available() -> bool:
    dev = pk.current_device()
    return dev.kind == "cpu" or int(getattr(dev, "arch", "sm_0")[3:]) >= 80


def bulk_available() -> bool:
    dev = pk.current_device()
    return dev.kind == "cpu" or int(getattr(dev, "arch", "sm_0")[3:]) >= 90


def q1_0_config(n: int, batch: int = 1, rows: int = 0) -> Q1Config:
    if pk.current_device().kind == "cpu":
        return CPU_CONFIG
    if n <= SHORT_ROW:
        over_l2 = rows * (n // 128) * 18 > L2_BYTES and n % 4096 == 0
        return OVER_L2_CONFIG if over_l2 and batch == 1 and bulk_available() else SHORT_CONFIG
    return LONG_CONFIG if batch <= 2 else LONG_BATCH_CONFIG


def gemv_q1_0_into(w, xp, y, rows: int, n: int, batch: int = 1, *, w2=None, res=None, mode=None,
                   stream=None, config: Q1Config | None = None, prefetch: bool | None = None):
    """y (batch, rows) = W @ x with w/w2 from gemv.weight_words(raw, "Q1_0", n) and xp the
    Q8-planes activations (batch, n//128*136 bytes, quantize_q8_planes_into). mode: None,
    "residual" (res (batch, rows), may be y), "swiglu", "geglu" (w2 = up rows)."""
    if not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"gemv_q1_0: batch {batch} outside 1..{MAX_BATCH}")
    if y.dtype != np.float32 or y.size != batch * rows:
        raise ValueError(f"gemv_q1_0: output must be float32 with {batch}x{rows} elements, "
                         f"got {y.dtype} {tuple(y.shape)}")
    groups = n // 128
    if n <= 0 or n % 128 or xp.nbytes != batch * groups * GROUP_WORDS * 4:
        raise ValueError(f"gemv_q1_0: activations must be Q8 planes of {batch} rows of {n} "
                         f"values ({groups * GROUP_WORDS * 4} bytes each), got {xp.nbytes} bytes")
    if (mode in ("swiglu", "geglu")) != (w2 is not None) or (mode == "residual") != \
            (res is not None):
        raise ValueError(f"gemv_q1_0: mode {mode!r} needs w2 (GLU) / res (residual) exactly")
    c = config or q1_0_config(n, batch, rows if w2 is None else 2 * rows)
    if c.warps % c.split:
        raise ValueError(f"gemv_q1_0: split {c.split} must divide warps {c.warps}")
    pair = groups % 2 == 0             # rows of 36-byte block pairs are u32-aligned
    bulk = 0
    if c.bulk:
        if c.bulk % 8 or c.stage < 1 or not bulk_available():
            raise ValueError(f"gemv_q1_0: bulk copies need sm_90+, stage >= 1 and a multiple "
                             f"of 8 blocks per chunk, got {c}")
        if groups % 8 == 0:       # chunks of 8 blocks where CB does not divide the row
            bulk = c.bulk if groups % c.bulk == 0 else 8
    elif c.stage == 1:
        raise ValueError("gemv_q1_0: stage must be 0 (direct loads) or a ring of >= 2, got 1")
    stage = c.stage if groups % 8 == 0 else 0
    nw = 2 if mode in ("swiglu", "geglu") else 1
    row_bytes = 4 * bulk_row_words(bulk) if bulk else 144
    ring = c.warps * stage * row_bytes * 16 * nw * c.tiles if stage > 1 or bulk else 0
    static = 4 * (c.split > 1) * c.warps * 32 * c.tiles * batch * nw + 8 * c.warps * stage * (
        bulk > 0)     # + the bulk ring's mbarriers
    if static > 48 << 10 or static + ring > MAX_SHARED:
        raise ValueError(f"gemv_q1_0: {c} needs {static} + {ring} bytes of shared memory "
                         f"(static at most 48 KiB, all at most {MAX_SHARED})")
    wt = np.uint32 if pair else np.uint16
    w = w.view(wt)
    w2 = w if w2 is None else w2.view(wt)
    row_words = groups * 18 // w.itemsize
    per_block = 16 * c.tiles * (c.warps // c.split)
    words = xp.reshape(-1).view(np.uint32) if xp.dtype != np.uint32 else xp.reshape(-1)
    if prefetch is None:
        prefetch = bool(getattr(pk.current_device(), "programmatic_launch", False))
    gemv_q1_0_kernel[(rows + per_block - 1) // per_block, c.warps * 32, stream, ring](
        w, w2, words, y if res is None else res, y, rows, row_words,
        groups // 2 if pair else groups, groups, wt, 2 if pair else 1, nw, c.warps, c.split,
        c.tiles, c.unroll, batch, MODES[mode], stage, prefetch, bulk)

