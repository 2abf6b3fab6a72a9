"""Prefill GEMM on GGUF weights with f16 tensor cores: Y[t, r] = sum_k W[r, k] * X[t, k].

    gemm(raw, "Q4_K", x) -> y                  raw uint8 (rows, row_bytes), x float32 (tokens, K)
    gemm_into(w_words, type, x, y, rows, K, tokens)   preallocated y (tokens, rows), no sync

With warps=(WM, WN) = (2, 4) (the default) each 256-thread block computes a 128-row x 128-token
tile of C = W X^T (warps=(1, 1): 16 x 16 tiles, for the CPU target's tests; short prompts take
32 x 32 or 64 x 64 tiles, SMALL_WARPS). Per 32-wide K step the
block decodes its 128 x 32 weight tile to f16 (decode8, any GGUF type incl. F16/BF16/F32) and
converts the 128 x 32 activation tile to f16 into shared memory; 8 warps (2 along rows x 4 along
tokens) each run 4 x 4 `mma.m16n8k16` tiles per 16-wide K slice with f32 accumulators. The next
K step's tiles are loaded into registers while the current one is multiplied.
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32

from .decode8_k import decode8
from .gemv import weight_words

BK = 32
STRIDE = BK // 2 + 4   # u32 (f16 pairs) per shared row; the +4 pad spreads fragment banks


@pk.func
def load_b_tile(x: Ptr[f32, "ro"], tokens: i32, K: i32, t: i32, k: i32):
    """16 activations x[t, k..k+15] as 8 f16 pairs (zeros past the last token)."""
    out = pk.local_array(u32, 8)
    for j in pk.static_range(8):
        out[j] = u32(0)
    if t < tokens:
        for q in pk.static_range(4):
            a, b, c, d = pk.load_vec(x, t * K + k + 4 * q, 4)
            out[2 * q] = pk.pack_f16x2(a, b)
            out[2 * q + 1] = pk.pack_f16x2(c, d)
    return out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7]


@pk.func
def load_a_tile(FMT: Const[int], w: Ptr[u32, "ro"], rows: i32, row_words: i32, r: i32, k: i32):
    """16 weights W[r, k..k+15] as 8 f16 pairs (zeros past the last row)."""
    out = pk.local_array(u32, 8)
    for j in pk.static_range(8):
        out[j] = u32(0)
    if r < rows:
        for h in pk.static_range(2):
            v0, v1, v2, v3, v4, v5, v6, v7 = decode8(FMT, w, r * row_words, k + 8 * h)
            out[4 * h] = pk.pack_f16x2(v0, v1)
            out[4 * h + 1] = pk.pack_f16x2(v2, v3)
            out[4 * h + 2] = pk.pack_f16x2(v4, v5)
            out[4 * h + 3] = pk.pack_f16x2(v6, v7)
    return out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7]


@pk.func
def store8(buf, r: i32, c: i32, v0: u32, v1: u32, v2: u32, v3: u32, v4: u32, v5: u32, v6: u32,
           v7: u32):
    buf[r, c] = v0
    buf[r, c + 1] = v1
    buf[r, c + 2] = v2
    buf[r, c + 3] = v3
    buf[r, c + 4] = v4
    buf[r, c + 5] = v5
    buf[r, c + 6] = v6
    buf[r, c + 7] = v7


@pk.kernel
def gemm_f16_kernel(w: Ptr["WT", "ro"], x: Ptr[f32, "ro"], y: Ptr[f32], ldy: i32, col0: i32,
                    res: Ptr[f32], rows: i32, row_words: i32, K: i32, tokens: i32,
                    FMT: Const[int], WT: Const[pk.dtype], WM: Const[int], WN: Const[int],
                    HAS_RES: Const[bool]):
    # WM x WN warps; tile = (16 WM WN) rows x (16 WM WN) tokens = one row-half per thread;
    # each warp owns MI = WN m16 tiles x NI = 2 WM n8 tiles
    As = pk.shared_array(u32, (16 * WM * WN, STRIDE))
    Bs = pk.shared_array(u32, (16 * WM * WN, STRIDE))
    tid = pk.thread_idx.x
    lane = tid % 32
    g = lane // 4
    tg = lane % 4
    wm = (tid // 32) % WM         # warp's slice of 16 WN rows
    wn = (tid // 32) // WM        # warp's slice of 16 WM tokens
    row0 = pk.block_idx.x * (16 * WM * WN)
    tok0 = pk.block_idx.y * (16 * WM * WN)
    lr = tid // 2                 # this thread's tile row (weights) / token (activations)
    lk = (tid % 2) * 16           # and its 16-wide K half
    acc = pk.local_array(f32, 8 * WM * WN)
    for i in pk.static_range(8 * WM * WN):
        acc[i] = 0.0
    a0, a1, a2, a3, a4, a5, a6, a7 = load_a_tile(FMT, w, rows, row_words, row0 + lr, lk)
    b0, b1, b2, b3, b4, b5, b6, b7 = load_b_tile(x, tokens, K, tok0 + lr, lk)
    for k0 in range(0, K, BK):
        col = lk // 2
        store8(As, lr, col, a0, a1, a2, a3, a4, a5, a6, a7)
        store8(Bs, lr, col, b0, b1, b2, b3, b4, b5, b6, b7)
        pk.syncthreads()
        if k0 + BK < K:  # prefetch the next K step into registers while the tensor cores work
            a0, a1, a2, a3, a4, a5, a6, a7 = load_a_tile(FMT, w, rows, row_words, row0 + lr,
                                                         k0 + BK + lk)
            b0, b1, b2, b3, b4, b5, b6, b7 = load_b_tile(x, tokens, K, tok0 + lr, k0 + BK + lk)
        for ks in pk.static_range(2):
            for mi in pk.static_range(WN):
                r = wm * 16 * WN + mi * 16 + g
                f0 = As[r, 8 * ks + tg]
                f1 = As[r + 8, 8 * ks + tg]
                f2 = As[r, 8 * ks + tg + 4]
                f3 = As[r + 8, 8 * ks + tg + 4]
                for ni in pk.static_range(2 * WM):
                    c = wn * 16 * WM + ni * 8 + g
                    i = 4 * (2 * WM * mi + ni)
                    acc[i], acc[i + 1], acc[i + 2], acc[i + 3] = pk.mma_m16n8k16_f16(
                        f0, f1, f2, f3, Bs[c, 8 * ks + tg], Bs[c, 8 * ks + tg + 4],
                        acc[i], acc[i + 1], acc[i + 2], acc[i + 3])
        pk.syncthreads()
    store_c(acc, y, ldy, col0, res, rows, tokens, row0 + wm * 16 * WN + g,
            tok0 + wn * 16 * WM + 2 * tg, WN, 2 * WM, HAS_RES)


@pk.func
def store_c(acc, y: Ptr[f32], ldy: i32, col0: i32, res: Ptr[f32], rows: i32, tokens: i32,
            r0: i32, t0: i32, MI: Const[int], NI: Const[int], HAS_RES: Const[bool]):
    """Accumulator fragments to y[t * ldy + col0 + r] (t < tokens, r < rows; c0,c1 at (row g,
    tokens 2t, 2t+1), plus res at the same place with HAS_RES: all of res is loaded before
    the first store, since y may alias res and a load placed after a store cannot be issued
    before it. 32-bit indices from y + col0 (64-bit ones cost 1-1.5% of an 8B prefill GEMM)."""
    yc = y + col0
    rc = res + col0
    for rd in pk.static_range(2 if HAS_RES else 1):
        for mi in pk.static_range(MI):
            for ni in pk.static_range(NI):
                i = 4 * (NI * mi + ni)
                r = r0 + mi * 16
                t = t0 + ni * 8
                for h in pk.static_range(4):
                    rr = r + 8 * (h // 2)
                    tt = t + h % 2
                    if rr < rows and tt < tokens:
                        if HAS_RES and rd == 0:
                            acc[i + h] += rc[tt * ldy + rr]
                        else:
                            yc[tt * ldy + rr] = acc[i + h]


def output_args(y, rows: int, tokens: int, ldy, col0: int, res, what: str):
    """(ldy, res or y, has_res) for a GEMM kernel writing C to columns col0 .. col0 + rows of
    y (tokens, ldy) float32 (ldy default rows; fewer than 2^31 values), plus res (same
    shape) where given."""
    ldy = rows if ldy is None else ldy
    if y.dtype != np.float32 or y.size != tokens * ldy or col0 < 0 or col0 + rows > ldy or \
            y.size >= 1 << 31:                      # the kernels index it with 32-bit ints
        raise ValueError(f"{what}: output must be float32 ({tokens}, {ldy}) with columns "
                         f"{col0}..{col0 + rows} inside, got {y.dtype} {tuple(y.shape)}")
    if res is None:
        return ldy, y, False
    if res.dtype != np.float32 or res.size != y.size:
        raise ValueError(f"{what}: res must be float32 like the output {tuple(y.shape)}, got "
                         f"{res.dtype} {tuple(res.shape)}")
    return ldy, res, True


# short prompts on CUDA: (at most this many tokens, warps), tried in order before (2, 4):
# 32 x 32 and 64 x 64 tiles keep more SMs busy and compute fewer padded token columns (H200,
# llama-8B Q4_1 prefill: 16 tokens 49.3 -> 33.0 ms, 128 tokens 57.5 -> 50.3; at 256 the
# 128 x 128 tiles are faster; benchmarks/short_prompts.py)
SMALL_WARPS: list[tuple[int, tuple[int, int]]] = [(32, (1, 2)), (128, (2, 2))]


def default_warps(tokens: int | None = None) -> tuple[int, int]:
    """(2, 4) warps = 128 x 128 tiles on CUDA (SMALL_WARPS first for `tokens`); (1, 1) = 16 x
    16 tiles on the CPU target, whose per-thread emulation makes big blocks slow (same kernel
    code either way)."""
    if pk.current_device().kind == "cpu":
        return (1, 1)
    for most, warps in SMALL_WARPS if tokens is not None else ():
        if tokens <= most:
            return warps
    return (2, 4)


def gemm_into(w, type_name: str, x, y, rows: int, K: int, tokens: int, stream=None,
              warps=None, *, ldy=None, col0: int = 0, res=None) -> None:
    """y (tokens, rows) = x (tokens, K) @ W^T; w from gemv.weight_words. No allocation.
    ldy / col0 / res: C goes to columns col0.. of y (tokens, ldy), plus res (output_args)."""
    if K % BK:
        raise ValueError(f"gemm {type_name}: K = {K} must be a multiple of {BK}")
    ldy, rv, has_res = output_args(y, rows, tokens, ldy, col0, res, "gemm")
    from .formats import get_format
    fmt = get_format(type_name)
    row_words = K // fmt.block_elems * fmt.block_bytes // w.itemsize
    wm, wn = warps or default_warps(tokens)
    tile = 16 * wm * wn
    grid = ((rows + tile - 1) // tile, (tokens + tile - 1) // tile)
    gemm_f16_kernel[grid, 32 * wm * wn, stream](w, x, y, ldy, col0, rv, rows, row_words, K,
                                                tokens, int(fmt.ggml_type), w.dtype, wm, wn,
                                                has_res)


def gemm(raw, type_name: str, x, warps=None):
    """Y (tokens, rows) = X (tokens, K) @ dequantize(W)^T on f16 tensor cores."""
    if isinstance(x, np.ndarray):
        x = pk.to_device(np.ascontiguousarray(x, dtype=np.float32))
    if x.dtype != np.float32 or x.ndim != 2:
        raise ValueError(f"gemm: activations must be float32 (tokens, K), got {x.dtype} "
                         f"{tuple(x.shape)}")
    w, rows = weight_words(raw, type_name, x.shape[1])
    y = pk.empty((x.shape[0], rows), np.float32)
    gemm_into(w, type_name, x, y, rows, x.shape[1], x.shape[0], warps=warps)
    return y
