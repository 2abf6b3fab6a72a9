"""The device functions of the Q1_0 binary tensor-core GEMV (gemv_q1_0.py, whose docstring
has the math and the geometry): fragment loads and the per-block mma (`block_mma`), the three
ways a warp walks its rows (`direct_loop`: fragments loaded straight from the rows; `ring_loop`:
8-block chunks through a `pk.cp_async` ring in shared memory; `bulk_loop`: chunks of whole rows
by `pk.bulk_copy` with one mbarrier per stage) and the final reduction (`reduce_and_store`).
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f16, f32, i32, u16, u32, u64

from .._device import init_warp_mbarriers
from .gemv_kernels import MODE_SWIGLU, epilogue

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
    init_warp_mbarriers(bars, warp, lane, S)
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
