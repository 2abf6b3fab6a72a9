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
from pykernel import Const, Ptr, f32, i32, u32

from .gemv_kernels import (MAX_BATCH, MODE_GEGLU, MODE_PLAIN, MODE_RESIDUAL, MODE_SWIGLU,
                           prefetch_then_wait)
from .gemv_q1_0_loops import (bulk_loop, bulk_row_words, direct_loop, reduce_and_store,
                              ring_loop)
from .q8_planes import GROUP_WORDS


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

