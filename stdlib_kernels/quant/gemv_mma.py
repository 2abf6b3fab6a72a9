"""Int8 tensor-core GEMV for a few tokens (batched decode, short prompts; 1..16): Y[t, r] =
sum_k W[r, k] X[t, k], Q4_K or Q6_K weights (MMA_GEMV_TYPES), Q8_1 activations.

    gemv_mma_into(w, type, xq, y, rows, K, tokens, stream=None, *, ldy=None, col0=0, res=None,
                  warps=None, unroll=None, tiles=None)
    gemv_mma(raw, type, x) -> y                      allocating form

Why a third kernel between the DP4A GEMV and the int8 GEMM: at 2..16 tokens the GEMV decodes
every weight block once per token (issue-bound from 4 tokens) and the GEMM passes each K step
through shared memory behind a barrier (1.2-1.4 TB/s on an H100; benchmarks/RESULTS.md
"Batched decode GEMVs"). Here a warp owns TILES x 16 weight rows and a contiguous share of the
K super-blocks, with all tokens as ceil(tokens / 8) n8 tiles; each thread loads its A fragment
bytes straight from the weights (16-byte header + four 8-byte loads of quants per row and
super-block, UNROLL super-blocks in flight), its B fragments from the Q8_1 rows (small and read
by every warp of the multiprocessor: L1 hits, each used for all the warp's row tiles), and runs
one `mma.m16n8k32` per 32-value block, row tile and n8 tile. The WARPS warps of a block share
its rows and split K; they sum their accumulators through shared memory at the end (one
barrier per launch, none in the K loop).

K order inside an mma: the four threads of a fragment row take the 32 values of a block as
four runs of 8 (thread tg: values 8 tg .. 8 tg + 7, a0 / a2 = their halves) instead of the
architectural 4 + 4 interleave; B takes the same permutation (its words 1 + 2 tg, 2 + 2 tg of
the Q8_1 block), so each dot product is unchanged and a thread's quants are one aligned 8-byte
load (Q4_K qs byte 32 j + l: value l of block 2 j in the low nibble, of block 2 j + 1 in the
high one). Per block: acc += d sc_kb dx_kb isum - dmin m_kb s_kb (Q8_1's s = dx sum(q)).

Q6_K (gemv_mma_q6k.py has its layout): one `mma.m16n8k16` per 16-value scale group (a k32 mma
would mix two scales) in the architectural K order, since a thread's bytes of a group are
then one 4-byte piece of a 16-byte window whatever the order; 16 mma per super-block, row
tile and n8 tile, the values made q - 32 in registers. Its 210-byte super-blocks start only
2-byte aligned: each quad loads the block's aligned words and a shuffle and a `prmt` per word
realign them (no branch on the start's parity). ROUTED_TYPES: what mma_gemv_applies,
quant.matmul and the runner send here (both, at MIN_TOKENS..MAX_TOKENS).
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u16, u32

from .. import _launch as L
from ..options import KernelOptions, env_options
from .decode8 import scale_min_k4
from .dot_q8 import LOW_NIBBLES
from .formats import GEMV_MMA, Q4_K, Q6_K, type_ids
from .gemm import output_args, store_c
from .gemm_q8 import q8_1_product
from .gemv import word_dtype
from .gemv_mma_q6k import Q6K_REGS, Q6K_U16, block_sums_q6k, load_q6k
from .q8_1 import q8_1_bytes

MMA_GEMV_TYPES = tuple(type_ids(GEMV_MMA))   # what gemv_mma_into runs (formats.py)
ROUTED_TYPES = MMA_GEMV_TYPES   # what quant.matmul and the runner send here
MAX_TOKENS = 16          # two n8 tiles
# fewest tokens routed here (quant.matmul, the runner): the 8B's batched decode step (H100) of
# 5 sequences took 5.59 ms on the DP4A GEMV against 4.68 for 6 on this kernel; at 4 tokens the
# GEMV is as fast (down 4096 x 14336: 18.3 us against 21.4)
MIN_TOKENS = 5
Q4K_WORDS = 36           # one Q4_K super-block: d | dmin | scales:12 B | qs:128 B
Q4K_REGS = 12            # words a thread keeps per row and super-block: header 4 | quants 8
SB_WORDS = {"Q4_K": Q4K_WORDS, "Q6_K": Q6K_U16}   # words of w per super-block (Q6_K: u16)
# default_launch's shapes, from benchmarks/small_gemm.py on an H100 (the 8B's Q4_K matmuls at
# 4 / 8 / 16 tokens, benchmarks/RESULTS.md "Batched decode: ..., a tensor-core GEMV for 5-16
# tokens"): 8 warps splitting K, one m16 tile per warp and 2 super-blocks ahead at up to 8
# tokens; two tiles (a B fragment load serves both) at 9-16 tokens or on wide matrices,
# where 4 warps suffice. Q6_K keeps 17 words per row and super-block (Q4_K 12): its two
# tiles load one super-block ahead (28672 x 4096 at 8 tokens, H200: 50.8 us against 60.3 for
# two ahead), otherwise Q4_K's shapes were as fast as any tried on the 8B's Q6_K matrices
WIDE_ROWS = 16384


def mma_gemv_applies(type_name: str, tokens: int, options: KernelOptions | None = None) -> bool:
    """Whether quant.matmul and the runner run `tokens` rows of a `type_name` matmul with
    Q8_1 activations here (instead of the DP4A GEMV or the int8 GEMM); options.mma_gemv off
    (PYKERNEL_MMA_GEMV=0): never. options None: env_options()."""
    return (options or env_options()).mma_gemv and type_name in ROUTED_TYPES and \
        MIN_TOKENS <= tokens <= MAX_TOKENS


def default_launch(rows: int, tokens: int, device=None,
                   type_name: str = "Q4_K") -> tuple[int, int, int]:
    """(warps, unroll, tiles) for `rows` weight rows of `type_name` and `tokens` tokens; the
    CPU target takes the smallest kernel (its compile time grows with the unrolled code)."""
    if (device or pk.current_device()).kind == "cpu":
        return 2, 1, 1
    wide, two_tiles = rows >= WIDE_ROWS, tokens > 8
    tiles = 2 if wide or two_tiles else 1
    ahead = 1 if two_tiles or (tiles == 2 and type_name == "Q6_K") else 2
    return 4 if wide else 8, ahead, tiles


@pk.func
def load_q4k(w: Ptr[u32, "ro"], base: i32, tg: i32, q, o: Const[int]):
    """Header words 0..3 of the super-block at word `base` to q[o + 0..3], then this thread's
    quants of each 64-value group j (words 4 + 8 j + 2 tg, +1) to q[o + 4 + 2 j], +1."""
    q[o], q[o + 1], q[o + 2], q[o + 3] = pk.load_vec(w, base, 4)
    for j in pk.static_range(4):
        q[o + 4 + 2 * j], q[o + 5 + 2 * j] = pk.load_vec(w, base + 4 + 8 * j + 2 * tg, 2)


@pk.func
def block_sums(xq: Ptr[u32, "ro"], acc, q, o: Const[int], sb: i32, g: i32, tg: i32,
               tokens: i32, xstride: i32, MI: Const[int], NT: Const[int]):
    """The 8 blocks of one super-block of the warp's 16 MI rows (loaded at q[o..]: 12 words
    per fragment row, rows g and g + 8 of m16 tile mi at o + 24 mi and o + 24 mi + 12)
    against every token. Each B fragment and token scale is loaded once for the MI tiles."""
    for kb in pk.static_range(8):
        j = kb // 2
        shift = u32(4 * (kb % 2))
        blk = 9 * (8 * sb + kb)          # the tokens' Q8_1 block: (d, s) word, 8 quant words
        b0 = pk.local_array(u32, NT)
        b1 = pk.local_array(u32, NT)
        ds0 = pk.local_array(u32, NT)
        ds1 = pk.local_array(u32, NT)
        for nt in pk.static_range(NT):
            xb = min(8 * nt + g, tokens - 1) * xstride + blk          # B column: token g
            b0[nt] = xq[xb + 1 + 2 * tg]
            b1[nt] = xq[xb + 2 + 2 * tg]
            ds0[nt] = xq[min(8 * nt + 2 * tg, tokens - 1) * xstride + blk]
            ds1[nt] = xq[min(8 * nt + 2 * tg + 1, tokens - 1) * xstride + blk]
        for mi in pk.static_range(MI):
            ra = o + 24 * mi
            rb = ra + 12
            a0 = (q[ra + 4 + 2 * j] >> shift) & u32(LOW_NIBBLES)
            a2 = (q[ra + 5 + 2 * j] >> shift) & u32(LOW_NIBBLES)
            a1 = (q[rb + 4 + 2 * j] >> shift) & u32(LOW_NIBBLES)
            a3 = (q[rb + 5 + 2 * j] >> shift) & u32(LOW_NIBBLES)
            da, dmina = pk.unpack_f16x2(q[ra])
            db, dminb = pk.unpack_f16x2(q[rb])
            sca, ma = scale_min_k4(q[ra + 1], q[ra + 2], q[ra + 3], kb)
            scb, mb = scale_min_k4(q[rb + 1], q[rb + 2], q[rb + 3], kb)
            ua = da * sca
            ub = db * scb
            va = dmina * ma
            vb = dminb * mb
            for nt in pk.static_range(NT):
                p0, p1, p2, p3 = pk.mma_m16n8k32_s8(a0, a1, a2, a3, b0[nt], b1[nt],
                                                    0, 0, 0, 0)
                dx0, sx0 = pk.unpack_f16x2(ds0[nt])
                dx1, sx1 = pk.unpack_f16x2(ds1[nt])
                i = 4 * (NT * mi + nt)   # C: (row g, tokens 2 tg, 2 tg + 1), row g + 8 alike
                acc[i] = pk.fma(ua * dx0, f32(p0), pk.fma(-va, sx0, acc[i]))
                acc[i + 1] = pk.fma(ua * dx1, f32(p1), pk.fma(-va, sx1, acc[i + 1]))
                acc[i + 2] = pk.fma(ub * dx0, f32(p2), pk.fma(-vb, sx0, acc[i + 2]))
                acc[i + 3] = pk.fma(ub * dx1, f32(p3), pk.fma(-vb, sx1, acc[i + 3]))


@pk.func
def gemv_mma_body(FMT: Const[int], w, xq: Ptr[u32, "ro"], y: Ptr[f32], ldy: i32, col0: i32,
                  res: Ptr[f32], rows: i32, row_words: i32, nsb: i32, tokens: i32, xstride: i32,
                  MI: Const[int], NT: Const[int], WARPS: Const[int], UNROLL: Const[int],
                  HAS_RES: Const[bool]):
    """Both formats' kernel: the warp's K share, then warps 1.. hand their sums to warp 0,
    which stores C. row_words: w's words per row (Q4_K u32, Q6_K u16)."""
    lane = pk.thread_idx.x % 32
    warp = pk.thread_idx.x // 32
    g = lane // 4
    tg = lane % 4
    r0 = pk.block_idx.x * 16 * MI
    first = warp * nsb // WARPS
    last = (warp + 1) * nsb // WARPS
    R = Q4K_REGS if FMT == Q4_K else Q6K_REGS       # words per fragment row and super-block
    acc = pk.local_array(f32, 4 * MI * NT)
    for i in pk.static_range(4 * MI * NT):
        acc[i] = 0.0
    base = pk.local_array(i32, 2 * MI)              # rows past the end: computed, not stored
    for h in pk.static_range(2 * MI):
        base[h] = min(r0 + 8 * h + g, rows - 1) * row_words
    q = pk.local_array(u32, 2 * R * MI * UNROLL)
    sb = first
    while sb < last:
        for u in pk.static_range(UNROLL):           # every load of UNROLL super-blocks first
            s = min(sb + u, last - 1)
            for h in pk.static_range(2 * MI):
                if FMT == Q4_K:
                    load_q4k(w, base[h] + Q4K_WORDS * s, tg, q, 2 * R * MI * u + R * h)
                else:
                    load_q6k(w, base[h] + Q6K_U16 * s, lane, q, 2 * R * MI * u + R * h)
        for u in pk.static_range(UNROLL):
            if sb + u < last:
                if FMT == Q4_K:
                    block_sums(xq, acc, q, 2 * R * MI * u, sb + u, g, tg, tokens, xstride, MI,
                               NT)
                else:
                    block_sums_q6k(xq, acc, q, 2 * R * MI * u, sb + u, g, tg, tokens, xstride,
                                   MI, NT)
        sb += UNROLL
    NACC = 4 * MI * NT
    if WARPS > 1:     # warps 1.. hand their sums to warp 0 (same order every launch)
        part = pk.shared_array(f32, (WARPS - 1) * NACC * 32)
        if warp > 0:
            for i in pk.static_range(NACC):
                part[((warp - 1) * NACC + i) * 32 + lane] = acc[i]
        pk.syncthreads()
        if warp == 0:
            for v in pk.static_range(WARPS - 1):
                for i in pk.static_range(NACC):
                    acc[i] += part[(v * NACC + i) * 32 + lane]
    if warp == 0:
        store_c(acc, y, ldy, col0, res, rows, tokens, r0 + g, 2 * tg, MI, NT, HAS_RES)


@pk.kernel
def gemv_mma_q4k(w: Ptr[u32, "ro"], xq: Ptr[u32, "ro"], y: Ptr[f32], ldy: i32, col0: i32,
                 res: Ptr[f32], rows: i32, row_words: i32, nsb: i32, tokens: i32, xstride: i32,
                 MI: Const[int], NT: Const[int], WARPS: Const[int], UNROLL: Const[int],
                 HAS_RES: Const[bool]):
    gemv_mma_body(Q4_K, w, xq, y, ldy, col0, res, rows, row_words, nsb, tokens, xstride, MI, NT,
                  WARPS, UNROLL, HAS_RES)


@pk.kernel
def gemv_mma_q6k(w: Ptr[u16, "ro"], xq: Ptr[u32, "ro"], y: Ptr[f32], ldy: i32, col0: i32,
                 res: Ptr[f32], rows: i32, row_words: i32, nsb: i32, tokens: i32, xstride: i32,
                 MI: Const[int], NT: Const[int], WARPS: Const[int], UNROLL: Const[int],
                 HAS_RES: Const[bool]):
    gemv_mma_body(Q6_K, w, xq, y, ldy, col0, res, rows, row_words, nsb, tokens, xstride, MI, NT,
                  WARPS, UNROLL, HAS_RES)


KERNELS = {"Q4_K": gemv_mma_q4k, "Q6_K": gemv_mma_q6k}


def gemv_mma_into(w, type_name: str, xq, y, rows: int, K: int, tokens: int, stream=None, *,
                  ldy=None, col0: int = 0, res=None, warps: int | None = None,
                  unroll: int | None = None, tiles: int | None = None) -> None:
    """y (tokens, rows) = X @ W^T for 1..MAX_TOKENS tokens, X as Q8_1 rows xq (tokens,
    q8_1_bytes(K)), w from gemv.weight_words (16-byte aligned; Q4_K u32, Q6_K u16). ldy /
    col0 / res as gemm_q8k_into's (C into columns col0.. of y (tokens, ldy), plus res).
    warps: K split over that many warps per block; unroll: super-blocks loaded ahead; tiles:
    m16 row tiles per warp (a block's rows: 16 tiles); each None: default_launch's. No host
    sync."""
    if type_name not in MMA_GEMV_TYPES:
        raise ValueError(f"gemv_mma: no tensor-core GEMV for {type_name}; supported: "
                         f"{list(MMA_GEMV_TYPES)}")
    if K <= 0 or K % 256:
        raise ValueError(f"gemv_mma {type_name}: K = {K} must be a positive multiple of 256")
    if not 1 <= tokens <= MAX_TOKENS:
        raise ValueError(f"gemv_mma: {tokens} tokens, expected 1..{MAX_TOKENS}")
    ld, rv, has_res = output_args(y, rows, tokens, ldy, col0, res, "gemv_mma")
    if xq.nbytes != tokens * q8_1_bytes(K):
        raise ValueError(f"gemv_mma: Q8_1 activations must hold {tokens} x {q8_1_bytes(K)} "
                         f"bytes, got {xq.nbytes}")
    wt = np.dtype(word_dtype(type_name))
    row_words = K // 256 * SB_WORDS[type_name]
    if w.dtype != wt or w.nbytes < rows * row_words * wt.itemsize:
        raise ValueError(f"gemv_mma {type_name}: weights must be {wt} words of {rows} rows x "
                         f"{row_words * wt.itemsize} bytes (gemv.weight_words), got {w.dtype} "
                         f"{w.nbytes} bytes")
    if w.ptr % 16 or xq.ptr % 4:
        raise ValueError("gemv_mma: weights must be 16-byte aligned, activations 4-byte")
    default = default_launch(rows, tokens, type_name=type_name)
    warps, unroll, tiles = warps or default[0], unroll or default[1], tiles or default[2]
    if not 1 <= warps <= 32 or not 1 <= unroll <= 8 or not 1 <= tiles <= 8:
        raise ValueError(f"gemv_mma: warps {warps} (1..32), unroll {unroll} (1..8) and tiles "
                         f"{tiles} (1..8)")
    words = xq.reshape(-1).view(np.uint32) if xq.dtype != np.uint32 else xq.reshape(-1)
    spec = (("MI", tiles), ("NT", -(-tokens // 8)), ("WARPS", warps), ("UNROLL", unroll),
            ("HAS_RES", has_res))
    L.launch(KERNELS[type_name], -(-rows // (16 * tiles)), 32 * warps,
             (w, words, y, ld, col0, rv, rows, row_words, K // 256, tokens, K // 32 * 9),
             spec, stream)


def gemv_mma(raw, type_name: str, x):
    """Allocating form: y (tokens, rows) float32 on the current device from raw weights
    (rows, row_bytes) uint8 and x (tokens, K) float32 (numpy or device)."""
    return q8_1_product(raw, type_name, x, "gemv_mma", gemv_mma_into)


__all__ = ["gemv_mma", "gemv_mma_into", "mma_gemv_applies", "default_launch",
           "MMA_GEMV_TYPES", "ROUTED_TYPES", "MIN_TOKENS", "MAX_TOKENS"]
