"""Prefill GEMM on int8 tensor cores (llama.cpp's mmq approach): Y[t, r] = sum_k W[r, k] X[t, k].

    gemm_q8(raw, "Q4_K", x) -> y          raw uint8 (rows, row_bytes), x float32 (tokens, K)
    gemm_q8_into(w, type, xq, y, rows, K, tokens)   xq = Q8_1 activations (q8_1.py), no sync

Types: INT8_GEMM_TYPES (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, Q4_1, Q5_0, Q5_1; the tile functions
also read MXFP4 as int8 for the MoE grouped GEMM, moe/grouped_gemm.py). The activations are
quantized to Q8_1 once (32-value blocks: d, s = d sum(q), int8 q). Each thread block computes a
BM-row x BN-token tile of C = W X^T; per K step of 32 KB values it unpacks the weights' integer
quants into an int8 tile in shared memory (Q4_0 q - 8, Q5_0 q - 16, Q6_K q - 32, Q4_K / Q5_K /
Q4_1 / Q5_1 q; no scales), keeps the per-32-block weight scales (Q6_K: per 16) and the min terms
(Q4_K, Q5_K, Q4_1, Q5_1) as floats, and copies the activations' int8 words and (d, s). Every
warp then runs `mma.m16n8k32.s8` per 32-wide block with a zero int32 accumulator and folds the
result into f32 accumulators: acc += d_w d_x isum (Q4_K / Q5_K also acc -= dmin m s_x; Q4_1 and
Q5_1 acc += m s_x). Q6_K's two 16-value scales per block cost two mma with the other half of A
zeroed. Tiles: Q8GemmTiles(mi, ni, wm, wn, kb): wm x wn warps, each 16 mi rows x 8 ni tokens, K
step 32 kb (halved until it divides K); TUNED_TILES per type (64 x 128 or 128 x 128, K step 128,
fits the 48 KB of static shared memory), no explicit double buffering. SUPERBLOCK_DEFAULT_TYPES
(all eight, K % 256 == 0) go to the pipelined super-block kernel of gemm_q8_k.py (2.5x faster on
the H200) unless Q8GemmTiles are passed. This file's per-block version serves K % 256 != 0 and
stays the reference the super-block kernel is checked against (tests, benchmarks/quant_gemm.py).
Measured in benchmarks/RESULTS.md; matmul.py picks the paths.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32

from .decode8 import scale_min_k4
from .dot_q8 import LOW_NIBBLES, half16, pair16
from .formats import GEMM_Q8, MXFP4, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, type_ids
from .gemm import output_args, store_c
from .gemm_q8_k import SUPERBLOCK_GEMM_TYPES, Q8KTiles, gemm_q8k_into
from .gemm_q8_k_parts import fifth_bits
from .gemv import weight_words
from .mxfp4 import BLOCK_BYTES as MXFP4_BYTES
from .mxfp4 import bytes4, codes_to_int8, e8m0_half
from .q8_1 import Q8_1_WORDS, q8_1_bytes, quantize_q8_1_into

INT8_GEMM_TYPES = type_ids(GEMM_Q8)   # type name -> ggml id (formats.py)
# types that go to the super-block kernel (gemm_q8_k.py) without explicit tiles (K % 256 == 0):
# all it serves; measured faster than this file's per-block kernel on an H200 (RESULTS.md):
# Q4_0 4096x512x14336 711 -> 294 us, Q8_0 506 -> 430 us
SUPERBLOCK_DEFAULT_TYPES = frozenset(SUPERBLOCK_GEMM_TYPES)
SIGN_BITS = 0x80808080


class Q8GemmTiles(NamedTuple):
    mi: int = 2     # m16 tiles per warp (weight rows)
    ni: int = 4     # n8 tiles per warp (tokens)
    wm: int = 4     # warps along rows
    wn: int = 2     # warps along tokens
    kb: int = 4     # 32-value blocks per K step

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, tokens) of one thread block's tile."""
        return 16 * self.mi * self.wm, 8 * self.ni * self.wn


# fastest of three shapes per type on the H200 at m=4096 n=512 k=14336 (benchmarks/RESULTS.md)
TUNED_TILES = {"Q4_0": Q8GemmTiles(2, 4, 2, 4, 4), "Q8_0": Q8GemmTiles(2, 4, 2, 4, 4),
               "Q4_K": Q8GemmTiles(4, 4, 2, 4, 4), "Q6_K": Q8GemmTiles(4, 4, 2, 4, 4)}
# Q4_1 / Q5_0 / Q5_1: Q4_0's shape (their blocks differ from it only in a min and a high bit)
TUNED_TILES.update({t: TUNED_TILES["Q4_0"] for t in ("Q4_1", "Q5_0", "Q5_1")})
TUNED_TILES["Q5_K"] = TUNED_TILES["Q4_K"]
CPU_TILES = Q8GemmTiles(1, 2, 1, 1, 2)        # 16 x 16, one warp: the CPU target emulates threads


@pk.func
def minus_bias(v: u32, bias: u32) -> u32:
    """Bytes of v (each < 128) minus the bytes of bias, as signed int8: each byte's top bit is set
    first so that no subtraction borrows from its neighbour, then flipped back."""
    return ((v | u32(SIGN_BITS)) - bias) ^ u32(SIGN_BITS)


@pk.func
def weight_word(FMT: Const[int], w, wrow: i32, k: i32) -> u32:
    """Int8 quants k..k+3 (k % 4 == 0) of the row at word wrow, block scales left out."""
    if FMT == Q4_K:   # 36 u32: d | dmin | scales:12 B | qs:128 B (64 values per 32 qs bytes)
        b = wrow + 36 * (k // 256)
        o = k % 256
        v = w[b + 4 + 8 * (o // 64) + (o % 32) // 4]
        return (v >> u32(4 * ((o % 64) // 32))) & u32(LOW_NIBBLES)
    elif FMT == Q5_K:  # 44 u32: d | dmin | scales:12 B | qh:32 B | qs:128 B; bit o // 32 of qh
        b = wrow + 44 * (k // 256)
        o = k % 256
        v = w[b + 12 + 8 * (o // 64) + (o % 32) // 4]
        high = ((w[b + 4 + (o % 32) // 4] >> u32(o // 32)) & u32(0x01010101)) << u32(4)
        return ((v >> u32(4 * ((o % 64) // 32))) & u32(LOW_NIBBLES)) | high
    elif FMT == Q6_K:  # 105 u16: ql:128 B | qh:64 B | scales:i8[16] | d
        b = wrow + 105 * (k // 256)
        o = k % 256
        n = o // 128
        g = (o % 128) // 32
        lo = (pair16(w, b + 32 * n + 16 * (g % 2) + (o % 32) // 2) >> u32(4 * (g // 2))) & \
            u32(LOW_NIBBLES)
        hi = (pair16(w, b + 64 + 16 * n + (o % 32) // 2) >> u32(2 * g)) & u32(0x03030303)
        return minus_bias(lo | (hi << u32(4)), u32(0x20202020))
    elif FMT == Q8_0:  # 17 u16: d | qs:i8[32]
        return pair16(w, wrow + 17 * (k // 32) + 1 + (k % 32) // 2)
    elif FMT == Q4_1:  # 5 u32: d, m | qs:16 B (low nibbles: values 0..15, high: 16..31)
        o = k % 32
        v = w[wrow + 5 * (k // 32) + 1 + (o % 16) // 4]
        return (v >> u32(4 * (o // 16))) & u32(LOW_NIBBLES)
    elif FMT == Q5_1:  # 6 u32: d, m | qh (bit j: value j's fifth bit) | qs:16 B
        o = k % 32
        b = wrow + 6 * (k // 32)
        v = w[b + 2 + (o % 16) // 4]
        return ((v >> u32(4 * (o // 16))) & u32(LOW_NIBBLES)) | fifth_bits(w[b + 1], o)
    elif FMT == Q5_0:  # 11 u16: d | qh:4 B | qs:16 B; values minus 16
        o = k % 32
        b = wrow + 11 * (k // 32)
        v = (pair16(w, b + 3 + (o % 16) // 2) >> u32(4 * (o // 16))) & u32(LOW_NIBBLES)
        return minus_bias(v | fifth_bits(pair16(w, b + 1), o), u32(0x10101010))
    elif FMT == MXFP4:  # 17 u8: e | qs:16 B (codes as Q4_0's nibbles; int8 = doubled e2m1)
        v = bytes4(w, wrow + MXFP4_BYTES * (k // 32) + 1 + (k % 32) % 16)
        return u32(codes_to_int8((v >> u32(4 * ((k % 32) // 16))) & u32(LOW_NIBBLES)))
    else:              # Q4_0, 9 u16: d | qs:16 B (low nibbles: values 0..15, high: 16..31)
        o = k % 32
        v = pair16(w, wrow + 9 * (k // 32) + 1 + (o % 16) // 2)
        return minus_bias((v >> u32(4 * (o // 16))) & u32(LOW_NIBBLES), u32(0x08080808))


@pk.func
def block_scales(FMT: Const[int], w, wrow: i32, k: i32):
    """(scale of values k..k+15, scale of k+16..k+31, m) of the 32-block at k: W = scale * q - m
    (m: Q4_K's dmin * min, applied through the activations' block sum; 0 otherwise)."""
    if FMT == Q4_K or FMT == Q5_K:
        b = wrow + (36 if FMT == Q4_K else 44) * (k // 256)
        sc, m = scale_min_k4(w[b + 1], w[b + 2], w[b + 3], (k % 256) // 32)
        d, dmin = pk.unpack_f16x2(w[b])
        return d * sc, d * sc, dmin * m
    elif FMT == Q6_K:
        b = wrow + 105 * (k // 256)
        pair = u32(w[b + 96 + (k % 256) // 32])   # the two i8 scales of this 32-block
        d = half16(w, b + 104)
        return d * f32(i32(pair << u32(24)) >> 24), d * f32(i32(pair << u32(16)) >> 24), 0.0
    elif FMT == Q8_0:
        d = half16(w, wrow + 17 * (k // 32))
        return d, d, 0.0
    elif FMT == Q4_1 or FMT == Q5_1:     # W = d q + m: the min enters as -m
        d, m = pk.unpack_f16x2(w[wrow + (5 if FMT == Q4_1 else 6) * (k // 32)])
        return d, d, -m
    elif FMT == Q5_0:
        d = half16(w, wrow + 11 * (k // 32))
        return d, d, 0.0
    elif FMT == MXFP4:   # 2^(e - 128): the e8m0 scale halved, as the quants are doubled
        d = e8m0_half(u32(w[wrow + MXFP4_BYTES * (k // 32)]))
        return d, d, 0.0
    else:
        d = half16(w, wrow + 9 * (k // 32))
        return d, d, 0.0


@pk.func
def load_weight_tile(FMT: Const[int], w, Aq, Ad, Am, rows: i32, row_words: i32, row0: i32,
                     k0: i32, tid: i32, BM: Const[int], KB: Const[int], NT: Const[int]):
    """Int8 quants of rows row0.. (zeros past the last row) and their per-block scales."""
    for j in pk.static_range(BM * 8 * KB // NT):
        i = tid + NT * j          # consecutive threads take consecutive words of a row
        r = i // (8 * KB)
        cw = i % (8 * KB)
        v = u32(0)
        if row0 + r < rows:
            v = weight_word(FMT, w, (row0 + r) * row_words, k0 + 4 * cw)
        Aq[r, cw] = v
    for j in pk.static_range((BM * KB + NT - 1) // NT):
        i = tid + NT * j
        if i < BM * KB:
            r = i // KB
            kb = i % KB
            d0 = 0.0
            d1 = 0.0
            m = 0.0
            if row0 + r < rows:
                d0, d1, m = block_scales(FMT, w, (row0 + r) * row_words, k0 + 32 * kb)
            Ad[r, 2 * kb] = d0
            Ad[r, 2 * kb + 1] = d1
            Am[r, kb] = m


@pk.func
def load_act_tile(xq: Ptr[u32, "ro"], Bq, Bd, Bs, tokens: i32, xstride: i32, tok0: i32,
                  k0: i32, tid: i32, BN: Const[int], KB: Const[int], NT: Const[int]):
    """Int8 words and (d, s) of the Q8_1 activations of tokens tok0.. (zeros past the last)."""
    for j in pk.static_range(BN * 8 * KB // NT):
        i = tid + NT * j
        t = i // (8 * KB)
        cw = i % (8 * KB)
        v = u32(0)
        if tok0 + t < tokens:
            v = xq[(tok0 + t) * xstride + Q8_1_WORDS * (k0 // 32 + cw // 8) + 1 + cw % 8]
        Bq[t, cw] = v
    for j in pk.static_range((BN * KB + NT - 1) // NT):
        i = tid + NT * j
        if i < BN * KB:
            t = i // KB
            kb = i % KB
            d = 0.0
            s = 0.0
            if tok0 + t < tokens:
                d, s = pk.unpack_f16x2(xq[(tok0 + t) * xstride + Q8_1_WORDS * (k0 // 32 + kb)])
            Bd[t, kb] = d
            Bs[t, kb] = s


@pk.func
def mma_block(FMT: Const[int], Aq, Bq, Ad, Am, Bd, Bs, acc, kb: Const[int], rbase: i32,
              cbase: i32, g: i32, tg: i32, MI: Const[int], NI: Const[int]):
    """One 32-wide K block of the warp's 16 MI x 8 NI tile, scaled into the f32 accumulators.
    Fragment c_e of an m16n8 tile: row g + 8 (e // 2), token 2 tg + e % 2."""
    bf = pk.local_array(u32, 2 * NI)
    dx = pk.local_array(f32, 2 * NI)
    sx = pk.local_array(f32, 2 * NI)
    for ni in pk.static_range(NI):
        c = cbase + 8 * ni
        bf[2 * ni] = Bq[c + g, 8 * kb + tg]
        bf[2 * ni + 1] = Bq[c + g, 8 * kb + 4 + tg]
        for e in pk.static_range(2):
            dx[2 * ni + e] = Bd[c + 2 * tg + e, kb]
            sx[2 * ni + e] = Bs[c + 2 * tg + e, kb]
    for mi in pk.static_range(MI):
        r = rbase + 16 * mi + g
        a0 = Aq[r, 8 * kb + tg]
        a1 = Aq[r + 8, 8 * kb + tg]
        a2 = Aq[r, 8 * kb + 4 + tg]
        a3 = Aq[r + 8, 8 * kb + 4 + tg]
        lo0, hi0, m0 = Ad[r, 2 * kb], Ad[r, 2 * kb + 1], Am[r, kb]
        lo8, hi8, m8 = Ad[r + 8, 2 * kb], Ad[r + 8, 2 * kb + 1], Am[r + 8, kb]
        for ni in pk.static_range(NI):
            i = 4 * (NI * mi + ni)
            b0 = bf[2 * ni]
            b1 = bf[2 * ni + 1]
            if FMT == Q6_K:   # one scale per 16 values: each k half in its own mma
                p0, p1, p2, p3 = pk.mma_m16n8k32_s8(a0, a1, u32(0), u32(0), b0, b1, 0, 0, 0, 0)
                q0, q1, q2, q3 = pk.mma_m16n8k32_s8(u32(0), u32(0), a2, a3, b0, b1, 0, 0, 0, 0)
                acc[i] += (lo0 * f32(p0) + hi0 * f32(q0)) * dx[2 * ni]
                acc[i + 1] += (lo0 * f32(p1) + hi0 * f32(q1)) * dx[2 * ni + 1]
                acc[i + 2] += (lo8 * f32(p2) + hi8 * f32(q2)) * dx[2 * ni]
                acc[i + 3] += (lo8 * f32(p3) + hi8 * f32(q3)) * dx[2 * ni + 1]
            else:
                p0, p1, p2, p3 = pk.mma_m16n8k32_s8(a0, a1, a2, a3, b0, b1, 0, 0, 0, 0)
                acc[i] += lo0 * dx[2 * ni] * f32(p0)
                acc[i + 1] += lo0 * dx[2 * ni + 1] * f32(p1)
                acc[i + 2] += lo8 * dx[2 * ni] * f32(p2)
                acc[i + 3] += lo8 * dx[2 * ni + 1] * f32(p3)
            if FMT == Q4_K or FMT == Q5_K or FMT == Q4_1 or FMT == Q5_1:
                acc[i] -= m0 * sx[2 * ni]
                acc[i + 1] -= m0 * sx[2 * ni + 1]
                acc[i + 2] -= m8 * sx[2 * ni]
                acc[i + 3] -= m8 * sx[2 * ni + 1]


@pk.func
def block_tile(FMT: Const[int], w, xq: Ptr[u32, "ro"], y: Ptr[f32], ldy: i32, col0: i32,
               res: Ptr[f32], w_rows: i32, row_words: i32, K: i32, tokens: i32, row0: i32,
               tok0: i32, y_row0: i32, y_rows: i32, MI: Const[int], NI: Const[int],
               WM: Const[int], WN: Const[int], KB: Const[int], HAS_RES: Const[bool]):
    """One block's tile: weight rows row0.. (below w_rows) times tokens tok0.. (below
    tokens), stored (plus res with HAS_RES) at y's rows y_row0.. (below y_rows): the dense
    GEMM's rows are y's; the grouped MoE GEMM's are one expert's stack, at offset row0 - y_row0."""
    # its tiles in shared memory (the block's: one call per kernel); stride 8 KB + 4 words:
    # rows g = 0..7 of a fragment read land in distinct bank quads
    Aq = pk.shared_array(u32, (16 * MI * WM, 8 * KB + 4))
    Bq = pk.shared_array(u32, (8 * NI * WN, 8 * KB + 4))
    Ad = pk.shared_array(f32, (16 * MI * WM, 2 * KB))
    Am = pk.shared_array(f32, (16 * MI * WM, KB))
    Bd = pk.shared_array(f32, (8 * NI * WN, KB))
    Bs = pk.shared_array(f32, (8 * NI * WN, KB))
    tid = pk.thread_idx.x
    lane = tid % 32
    wm = (tid // 32) % WM
    wn = (tid // 32) // WM
    xstride = K // 32 * Q8_1_WORDS
    acc = pk.local_array(f32, 4 * MI * NI)
    for i in pk.static_range(4 * MI * NI):
        acc[i] = 0.0
    for k0 in range(0, K, 32 * KB):
        load_weight_tile(FMT, w, Aq, Ad, Am, w_rows, row_words, row0, k0, tid, 16 * MI * WM, KB,
                         32 * WM * WN)
        load_act_tile(xq, Bq, Bd, Bs, tokens, xstride, tok0, k0, tid, 8 * NI * WN, KB,
                      32 * WM * WN)
        pk.syncthreads()
        for kb in pk.static_range(KB):
            mma_block(FMT, Aq, Bq, Ad, Am, Bd, Bs, acc, kb, wm * 16 * MI, wn * 8 * NI,
                      lane // 4, lane % 4, MI, NI)
        pk.syncthreads()
    store_c(acc, y, ldy, col0, res, y_rows, tokens, y_row0 + wm * 16 * MI + lane // 4,
            tok0 + wn * 8 * NI + 2 * (lane % 4), MI, NI, HAS_RES)


@pk.kernel
def gemm_q8_kernel(w: Ptr["WT", "ro"], xq: Ptr[u32, "ro"], y: Ptr[f32], ldy: i32, col0: i32,
                   res: Ptr[f32], rows: i32, row_words: i32, K: i32, tokens: i32,
                   FMT: Const[int], WT: Const[pk.dtype], MI: Const[int], NI: Const[int],
                   WM: Const[int], WN: Const[int], KB: Const[int], HAS_RES: Const[bool]):
    row0 = pk.block_idx.x * (16 * MI * WM)
    block_tile(FMT, w, xq, y, ldy, col0, res, rows, row_words, K, tokens, row0,
               pk.block_idx.y * (8 * NI * WN), row0, rows, MI, NI, WM, WN, KB, HAS_RES)


def default_tiles(type_name: str) -> Q8GemmTiles:
    return CPU_TILES if pk.current_device().kind == "cpu" else TUNED_TILES[type_name]


def gemm_q8_into(w, type_name: str, xq, y, rows: int, K: int, tokens: int, stream=None,
                 tiles: Q8GemmTiles | Q8KTiles | None = None, *, ldy=None, col0: int = 0,
                 res=None) -> None:
    """y (tokens, rows) = X @ W^T with X given as Q8_1 rows xq (tokens, q8_1_bytes(K)) and w
    from gemv.weight_words. No allocation, no host sync. SUPERBLOCK_DEFAULT_TYPES (and any
    type of gemm_q8_k.SUPERBLOCK_GEMM_TYPES given Q8KTiles) go to the pipelined super-block
    kernel (gemm_q8_k.py); Q8GemmTiles ask for this file's kernel. ldy / col0 / res: C goes
    to columns col0.. of y (tokens, ldy), plus res (gemm.output_args)."""
    if type_name not in INT8_GEMM_TYPES:
        raise ValueError(f"gemm_q8: no int8 GEMM for {type_name}; supported: "
                         f"{sorted(INT8_GEMM_TYPES)}")
    if K <= 0 or K % 32:
        raise ValueError(f"gemm_q8 {type_name}: K = {K} must be a positive multiple of 32")
    if xq.nbytes != tokens * q8_1_bytes(K):
        raise ValueError(f"gemm_q8: Q8_1 activations must hold {tokens} x {q8_1_bytes(K)} "
                         f"bytes, got {xq.nbytes}")
    by_default = type_name in SUPERBLOCK_DEFAULT_TYPES and K % 256 == 0 and tiles is None
    if type_name in SUPERBLOCK_GEMM_TYPES and (by_default or isinstance(tiles, Q8KTiles)) and \
            w.ptr % 16 == 0 and xq.ptr % 16 == 0:
        gemm_q8k_into(w, type_name, xq, y, rows, K, tokens, stream=stream, tiles=tiles,
                      ldy=ldy, col0=col0, res=res)
        return
    ld, rv, has_res = output_args(y, rows, tokens, ldy, col0, res, "gemm_q8")
    t = tiles or default_tiles(type_name)
    kb = t.kb
    while (K // 32) % kb:
        kb //= 2
    threads = 32 * t.wm * t.wn
    bm, bn = t.shape
    if (bm * 8 * kb) % threads or (bn * 8 * kb) % threads:
        raise ValueError(f"gemm_q8: tiles {t} do not split evenly over {threads} threads")
    from .formats import get_format
    fmt = get_format(type_name)
    row_words = K // fmt.block_elems * fmt.block_bytes // w.itemsize
    words = xq.reshape(-1).view(np.uint32) if xq.dtype != np.uint32 else xq.reshape(-1)
    grid = ((rows + bm - 1) // bm, (tokens + bn - 1) // bn)
    gemm_q8_kernel[grid, threads, stream](w, words, y, ld, col0, rv, rows, row_words, K, tokens,
                                          INT8_GEMM_TYPES[type_name], w.dtype, t.mi, t.ni, t.wm,
                                          t.wn, kb, has_res)


def gemm_q8(raw, type_name: str, x, tiles: Q8GemmTiles | Q8KTiles | None = None):
    """Y (tokens, rows) = X (tokens, K) @ dequantize(W)^T, X quantized to Q8_1 here."""
    return q8_1_product(raw, type_name, x, "gemm_q8", lambda *args: gemm_q8_into(
        *args, tiles=tiles))


def q8_1_product(raw, type_name: str, x, what: str, into):
    """Allocating form of a Q8_1-activation matmul: X (tokens, K) float32 (numpy or device)
    quantized to Q8_1, then into(w, type_name, xq, y, rows, K, tokens) fills the new y."""
    if isinstance(x, np.ndarray):
        x = pk.to_device(np.ascontiguousarray(x, dtype=np.float32))
    if x.dtype != np.float32 or x.ndim != 2:
        raise ValueError(f"{what}: activations must be float32 (tokens, K), got {x.dtype} "
                         f"{tuple(x.shape)}")
    tokens, K = x.shape
    w, rows = weight_words(raw, type_name, K)
    xq = pk.empty((tokens, q8_1_bytes(K)), np.uint8)
    quantize_q8_1_into(x, xq)
    y = pk.empty((tokens, rows), np.float32)
    into(w, type_name, xq, y, rows, K, tokens)
    return y
