"""Decode GEMV kernels on GGUF weight rows: y[b, r] = sum_k W[r, k] * x[b, k] for 1..8 tokens.

    gemv_q8_kernel   x as Q8_1 (q8_1.py), DP4A integer dot products (dot_q8.py)
    gemv_f32_kernel  x as float32, weights decoded to f32 eight at a time (decode8.py)

Grid: one thread block per output row, WARPS warps stride over the row's items (16..32 bytes of
weights each), then a warp-shuffle + shared-memory reduction. MODE fuses the epilogue:
0 plain, 1 y = Wx + res (residual add; res may alias y), 2 y = silu(Wx) * (W2 x) (SwiGLU gate/up
in one launch), 3 y = gelu_tanh(Wx) * (W2 x) (GeGLU). Shapes: w/w2 (rows, row_words), x or xq
(BATCH, ...), res/y (BATCH, rows).
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32

from . import decode8_k as d8
from . import dot_q8 as q8

MAX_BATCH = 8
# ggml type ids (gguf.GGMLQuantizationType) as plain ints: compile-time branch keys
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16, Q1_0 = 10, 11, 12, 13, 14, 30, 41
# block-pair variants (rows of an even number of 2-byte-aligned blocks, read as u32 words)
Q4_0_PAIR, Q8_0_PAIR = 1002, 1008
MODE_PLAIN, MODE_RESIDUAL, MODE_SWIGLU, MODE_GEGLU = 0, 1, 2, 3


@pk.func
def item_dot_q8(FMT: Const[int], w: Ptr[u32, "ro"], wrow: i32, blk: i32, part: i32,
                xq: Ptr[u32, "ro"], xrow: i32) -> f32:
    r = f32(0.0)
    if FMT == Q4_0:
        r = q8.dot_q8_Q4_0(w, wrow, blk, part, xq, xrow)
    elif FMT == Q4_1:
        r = q8.dot_q8_Q4_1(w, wrow, blk, part, xq, xrow)
    elif FMT == Q8_0:
        r = q8.dot_q8_Q8_0(w, wrow, blk, part, xq, xrow)
    elif FMT == Q4_K:
        r = q8.dot_q8_Q4_K(w, wrow, blk, part, xq, xrow)
    elif FMT == Q6_K:
        r = q8.dot_q8_Q6_K(w, wrow, blk, part, xq, xrow)
    elif FMT == Q4_0_PAIR:
        r = q8.dot_q8_Q4_0_pair(w, wrow, blk, part, xq, xrow)
    elif FMT == Q8_0_PAIR:
        r = q8.dot_q8_Q8_0_pair(w, wrow, blk, part, xq, xrow)
    return r


@pk.func
def warp_sum(v: f32) -> f32:
    for step in pk.static_range(5):
        v = v + pk.shfl_xor(v, 16 >> step)
    return v


@pk.func
def epilogue(v: f32, v2: f32, res: Ptr[f32], y: Ptr[f32], idx: i32, MODE: Const[int]):
    if MODE == MODE_PLAIN:
        y[idx] = v
    elif MODE == MODE_RESIDUAL:
        y[idx] = v + res[idx]
    elif MODE == MODE_SWIGLU:
        y[idx] = v / (1.0 + pk.exp(-v)) * v2
    else:  # gelu, tanh approximation (ggml_gelu, gelu_pytorch_tanh)
        inner = 0.7978845608028654 * (v + 0.044715 * v * v * v)
        y[idx] = 0.5 * v * (1.0 + pk.tanh(inner)) * v2


@pk.kernel
def gemv_q8_kernel(w: Ptr["WT", "ro"], w2: Ptr["WT", "ro"], xq: Ptr[u32, "ro"], res: Ptr[f32],
                   y: Ptr[f32], rows: i32, row_words: i32, nblocks: i32, xq_words: i32,
                   FMT: Const[int], WT: Const[pk.dtype], ITEMS: Const[int], WARPS: Const[int],
                   BATCH: Const[int], MODE: Const[int]):
    row = pk.block_idx.x
    tid = pk.thread_idx.x
    acc = pk.local_array(f32, 16)   # [0, 8): W x per token, [8, 16): W2 x (GLU modes)
    for bt in pk.static_range(16):
        acc[bt] = 0.0
    wrow = row * row_words
    for it in range(tid, nblocks * ITEMS, WARPS * 32):
        blk = it // ITEMS
        part = it % ITEMS
        for bt in pk.static_range(BATCH):
            acc[bt] += item_dot_q8(FMT, w, wrow, blk, part, xq, bt * xq_words)
            if MODE >= MODE_SWIGLU:
                acc[8 + bt] += item_dot_q8(FMT, w2, wrow, blk, part, xq, bt * xq_words)
    reduce_and_store(acc, res, y, rows, row, WARPS, BATCH, MODE)


@pk.func
def reduce_and_store(acc, res: Ptr[f32], y: Ptr[f32], rows: i32, row: i32,
                     WARPS: Const[int], BATCH: Const[int], MODE: Const[int]):
    tid = pk.thread_idx.x
    red = pk.shared_array(f32, WARPS * 16)
    for bt in pk.static_range(BATCH):
        v = warp_sum(acc[bt])
        v2 = f32(0.0)
        if MODE >= MODE_SWIGLU:
            v2 = warp_sum(acc[8 + bt])
        if tid % 32 == 0:
            red[(tid // 32) * 16 + bt] = v
            red[(tid // 32) * 16 + 8 + bt] = v2
    pk.syncthreads()
    if tid < BATCH:
        t = f32(0.0)
        t2 = f32(0.0)
        for k in pk.static_range(WARPS):
            t += red[k * 16 + tid]
            t2 += red[k * 16 + 8 + tid]
        epilogue(t, t2, res, y, tid * rows + row, MODE)


@pk.kernel
def gemv_f32_kernel(w: Ptr["WT", "ro"], w2: Ptr["WT", "ro"], x: Ptr[f32, "ro"], res: Ptr[f32],
                    y: Ptr[f32], rows: i32, row_words: i32, n: i32,
                    FMT: Const[int], WT: Const[pk.dtype], WARPS: Const[int],
                    BATCH: Const[int], MODE: Const[int]):
    row = pk.block_idx.x
    tid = pk.thread_idx.x
    acc = pk.local_array(f32, 16)
    for bt in pk.static_range(16):
        acc[bt] = 0.0
    wrow = row * row_words
    for g in range(tid, n // 8, WARPS * 32):
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
                acc[8 + bt] += (u0 * a0 + u1 * a1 + u2 * a2 + u3 * a3) + \
                    (u4 * a4 + u5 * a5 + u6 * a6 + u7 * a7)
    reduce_and_store(acc, res, y, rows, row, WARPS, BATCH, MODE)
