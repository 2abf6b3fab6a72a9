"""Q8_0 KV caches for decode attention: ggml's block_q8_0 (an f16 scale and 32 int8 quants per
32 values) split in two arrays, so the quants of a row stay 16-byte aligned for vector loads.

    cache = quantize_kv(k)            k (..., max_len, D) float, D % 32 == 0 -> Q8Cache
    dequantize_kv(cache) -> float32   (the values attention sees; for references)
    allocate(shape)                   an empty cache on the device (the runner's)
    store_rows(k, v, ck, cv, start)   device f32 rows -> Q8_0 cache rows at start[0] + t
    dequantize_into(cache, out, n)    the first n rows of every head as f16 (for prefill)

Quantization is ggml's reference Q8_0 (stdlib_kernels.quant.reference), bit-exact, on the host
and on the device (store_q8_0_row, also used by rotary's fused RoPE + cache write).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f16, f32, i8, i32, i64, u16, u32

from .. import _launch as L
from .._device import warp_max
from ..quant import reference as ref
from ..quant.q8_1 import round_half_away

BLOCK = 32
DTYPE = "q8_0"
BYTES_PER_VALUE = (BLOCK + 2) / BLOCK   # 32 int8 quants + one f16 scale per block


@dataclass(frozen=True)
class Q8Cache:
    """quants (..., max_len, D) int8 and scales (..., max_len, D / 32) float16 on a device."""
    quants: pk.Array
    scales: pk.Array

    def __post_init__(self):
        q, d = self.quants, self.scales
        if q.dtype != np.int8 or d.dtype != np.float16 or q.shape[-1] % BLOCK or \
                d.shape != q.shape[:-1] + (q.shape[-1] // BLOCK,):
            raise ValueError(f"Q8Cache: quants (..., D) int8 and scales (..., D / 32) float16 "
                             f"expected, got {q.shape} {q.dtype} and {d.shape} {d.dtype}")

    shape = property(lambda self: self.quants.shape)
    ndim = property(lambda self: self.quants.ndim)
    dtype = property(lambda self: DTYPE)


def quantize_kv(x, device=None) -> Q8Cache:
    """A float array (..., D) -> its Q8_0 cache on `device` (default: the current one)."""
    x = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    if x.ndim < 2 or x.shape[-1] % BLOCK:
        raise ValueError(f"quantize_kv: expected (..., D) with D a multiple of {BLOCK}, got "
                         f"{x.shape}")
    blocks = ref.quantize(x.reshape(-1, x.shape[-1]), "Q8_0").reshape(-1, 2 + BLOCK)
    scales = blocks[:, :2].copy().view(np.float16).reshape(x.shape[:-1] + (-1,))
    quants = blocks[:, 2:].copy().view(np.int8).reshape(x.shape)
    return Q8Cache(pk.to_device(quants, device=device), pk.to_device(scales, device=device))


def dequantize_kv(cache: Q8Cache) -> np.ndarray:
    q = cache.quants.numpy().astype(np.float32)
    d = cache.scales.numpy().astype(np.float32)
    return (q.reshape(d.shape + (BLOCK,)) * d[..., None]).reshape(q.shape)


# --- device side: the runner's Q8_0 KV cache (written per token, read back as f16) ----------

@pk.func
def store_q8_0_row(stage, quants, scales, row: i64, D: i32):
    """Whole block, one warp per 32-block: stage[0:D] (f32 in shared memory, written and synced
    by this block) -> Q8_0 row `row` of a cache: quants[row * D + i] int8 and
    scales[row * D / 32 + j] (f16 bits). ggml's quantize_row_q8_0 (and llama.cpp's CUDA copy
    into a q8_0 cache): d = amax / 127, q = roundf(x * (1 / d)), 0 where d == 0."""
    lane = pk.lane_id()
    for j in range(pk.thread_idx.x // 32, D // 32, pk.block_dim.x // 32):
        x = stage[32 * j + lane]
        amax = warp_max(abs(x))
        d = amax / 127.0
        inv = 1.0 / d if d != 0.0 else f32(0.0)
        quants[row * i64(D) + i64(32 * j + lane)] = i8(i32(round_half_away(x * inv)))
        if lane == 0:
            scales[row * i64(D // 32) + i64(j)] = pk.bitcast(f16(d), u16)


@pk.kernel
def store_rows_q8_0(k: Ptr[f32, "ro"], v: Ptr[f32, "ro"], k_quants: Ptr[i8], v_quants: Ptr[i8],
                    k_scales: Ptr[u16], v_scales: Ptr[u16], start: Ptr[i32, "ro"],
                    n_kv: i32, max_len: i32, D: i32, MAXD: Const[int]):
    # grid (tokens, n_kv): token t's K and V head h (rows of (tokens, n_kv, D) f32) into cache
    # slot start[0] + t (skipped outside the cache)
    pk.launch_dependents()
    stage = pk.shared_array(f32, MAXD)
    t = pk.block_idx.x
    h = pk.block_idx.y
    pos = start[0] + t
    if pos >= 0 and pos < max_len:
        src = (i64(t) * i64(n_kv) + i64(h)) * i64(D)
        row = i64(h) * i64(max_len) + i64(pos)
        for d in range(pk.thread_idx.x, D, pk.block_dim.x):
            stage[d] = k[src + i64(d)]
        pk.syncthreads()
        store_q8_0_row(stage, k_quants, k_scales, row, D)
        pk.syncthreads()
        for d in range(pk.thread_idx.x, D, pk.block_dim.x):
            stage[d] = v[src + i64(d)]
        pk.syncthreads()
        store_q8_0_row(stage, v_quants, v_scales, row, D)


@pk.kernel
def dequantize_rows_f16(quants: Ptr[u32, "ro"], scales: Ptr[u16, "ro"], out: Ptr[u32],
                        n_rows: i32, max_len: i32, out_len: i32, D: i32, n_kv: i32):
    # one thread per 4 quants (one u32 word) of rows 0 .. n_rows - 1 of every head: their f16
    # values (q * d rounded once, what llama.cpp's q8_0 -> f16 conversion gives) into out
    # (n_kv, out_len, D) f16 viewed as u32 pairs
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    W = D // 4
    if i < n_kv * n_rows * W:
        c = i % W
        r = (i // W) % n_rows
        h = i // (W * n_rows)
        src_row = i64(h) * i64(max_len) + i64(r)
        word = quants[src_row * i64(W) + i64(c)]
        d = f32(pk.bitcast(scales[src_row * i64(D // 32) + i64(c // 8)], f16))
        b0 = f32(i32(word << u32(24)) >> 24)
        b1 = f32(i32(word << u32(16)) >> 24)
        b2 = f32(i32(word << u32(8)) >> 24)
        b3 = f32(i32(word) >> 24)
        dst = (i64(h) * i64(out_len) + i64(r)) * i64(W) + i64(c)
        out[dst * 2] = pk.pack_f16x2(b0 * d, b1 * d)
        out[dst * 2 + 1] = pk.pack_f16x2(b2 * d, b3 * d)


MAX_HEAD_DIM = 256       # MAXD: the staging row of the cache writes (attention's largest D)


def allocate(shape, device=None, allocate=None) -> Q8Cache:
    """An uninitialised Q8_0 cache of `shape` (..., max_len, D) on `device`; `allocate(shape,
    dtype)` (e.g. the runner's accounted allocator) replaces pk.empty when given."""
    if shape[-1] % BLOCK:
        raise ValueError(f"a Q8_0 KV cache needs head_dim a multiple of {BLOCK}, got {shape[-1]}")
    alloc = allocate or (lambda s, dt: pk.empty(s, dt, device))
    return Q8Cache(alloc(tuple(shape), np.int8),
                   alloc(tuple(shape[:-1]) + (shape[-1] // BLOCK,), np.float16))


def check_pair(cache_k, cache_v, name: str) -> None:
    if not (isinstance(cache_k, Q8Cache) and isinstance(cache_v, Q8Cache)) or \
            cache_k.shape != cache_v.shape or cache_k.ndim != 3 or \
            cache_k.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"{name}: K and V must be two Q8Cache of one (n_kv_head, max_len, D) "
                         f"shape with D <= {MAX_HEAD_DIM}, got {cache_k.shape} and "
                         f"{getattr(cache_v, 'shape', type(cache_v).__name__)}")


def store_rows(k, v, cache_k: Q8Cache, cache_v: Q8Cache, start, stream=None) -> None:
    """k, v (tokens, n_kv, D) float32 on the device -> Q8_0 rows start[0] + t of the caches
    (start: a device int32 array, so a captured graph replays at new positions)."""
    check_pair(cache_k, cache_v, "kv_q8.store_rows")
    n_kv, max_len, d = cache_k.shape
    tokens = k.size // (n_kv * d)
    if k.size != tokens * n_kv * d or v.size != k.size or k.dtype != np.float32 or \
            v.dtype != np.float32:
        raise ValueError(f"kv_q8.store_rows: k {k.shape} {k.dtype} and v {v.shape} {v.dtype} "
                         f"must be float32 (tokens, {n_kv}, {d})")
    args = (k, v, cache_k.quants, cache_v.quants, cache_k.scales.view(np.uint16),
            cache_v.scales.view(np.uint16), start, n_kv, max_len, d)
    L.launch(store_rows_q8_0, (tokens, n_kv, 1), L.threads_for(d, 256), args,
             (("MAXD", MAX_HEAD_DIM),), stream)


def dequantize_into(cache: Q8Cache, out, n_rows: int, stream=None) -> None:
    """Rows 0 .. n_rows - 1 of every head of `cache` (n_kv, max_len, D) as f16 into out
    (n_kv, out_len >= n_rows, D) float16 on the device (the prefill attention's input)."""
    n_kv, max_len, d = cache.shape
    if out.dtype != np.float16 or out.ndim != 3 or out.shape[0] != n_kv or \
            out.shape[2] != d or not 0 <= n_rows <= min(out.shape[1], max_len):
        raise ValueError(f"kv_q8.dequantize_into: out must be float16 ({n_kv}, >= {n_rows}, "
                         f"{d}), got {out.shape} {out.dtype}")
    total = n_kv * n_rows * (d // 4)
    if total == 0:
        return
    args = (cache.quants.view(np.uint32), cache.scales.view(np.uint16), out.view(np.uint32),
            n_rows, max_len, out.shape[1], d, n_kv)
    L.launch(dequantize_rows_f16, -(-total // 256), 256, args, (), stream)
