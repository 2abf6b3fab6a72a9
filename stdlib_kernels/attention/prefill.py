"""Host side of prefill attention: a block of new tokens attending (causally) to the KV cache,
which already holds their own keys and values.

Input: device arrays: q (tokens, n_head, D) f32 for positions start .. start + tokens - 1;
K/V caches (n_kv_head, max_len, D) f16 or f32 holding positions 0 .. start + tokens - 1;
a preallocated out (tokens, n_head, D) f32.
Output: the attention result written into `out`.

Paths: "mma" (prefill_flash.prefill_flash: tensor cores, f16 cache, sm_80+), "wgmma"
(prefill_wgmma: FlashAttention-3's structure on Hopper's wgmma, f16 cache, head_dim 64 / 128,
sm_90; an option, not the default) and "simt" (the
decode kernel with one query row per token, kv_len = start + row + 1: any arch, f32 or f16
cache, f32 arithmetic; it is also the reference-accurate path for f32 caches, since the mma
path rounds Q, K, V and P to f16).
"""
from __future__ import annotations

import numpy as np

import pykernel as pk

from .._launch import zero_i32
from .decode import HEAD_DIMS, KeyRange, check_sinks, launch_decode
from .decode_kernels import LOG2E
from .decode_plan import cuda_sm
from .prefill_flash import prefill_flash
from .prefill_wgmma import launch_prefill_wgmma

MMA_WARPS = 4
MMA_STAGES = 3


def mma_available(device=None) -> bool:
    return cuda_sm(device) >= 80


def default_path(k_cache, device=None) -> str:
    """Tensor cores for f16 caches on sm_80+; everything else takes the f32 SIMT path."""
    return "mma" if k_cache.dtype == np.float16 and mma_available(device) else "simt"


def _q_geometry(q, k_cache, n_head) -> tuple[int, int, int, int]:
    """(tokens, n_head, head_dim, elements from one token's q row to the next): q is (tokens,
    n_head, head_dim), or (tokens, W) whose first n_head * head_dim columns are the heads (a
    fused q|k|v projection's output, read in place)."""
    if q.dtype != np.float32 or q.ndim not in (2, 3) or (q.ndim == 2) != (n_head is not None):
        raise ValueError(f"attention.prefill: q must be (tokens, n_head, head_dim) float32, or "
                         f"(tokens, W) float32 with n_head given, got {q.shape} {q.dtype} "
                         f"(n_head {n_head})")
    if q.ndim == 3:
        return (*q.shape, q.shape[1] * q.shape[2])
    head_dim = k_cache.shape[-1]
    if n_head * head_dim > q.shape[1]:
        raise ValueError(f"attention.prefill: {n_head} heads of {head_dim} do not fit q rows "
                         f"of {q.shape[1]} values")
    return q.shape[0], n_head, head_dim, q.shape[1]


def _check_prefill_shapes(q, k_cache, v_cache, start: int, n_head=None):
    if k_cache.ndim != 3 or k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"attention.prefill: caches must both be (n_kv_head, max_len, "
                         f"head_dim), got {k_cache.shape} {k_cache.dtype} and "
                         f"{v_cache.shape} {v_cache.dtype}")
    tokens, n_head, head_dim, _ = _q_geometry(q, k_cache, n_head)
    n_kv_head, max_len, cache_dim = k_cache.shape
    if cache_dim != head_dim or n_head % n_kv_head or head_dim not in HEAD_DIMS:
        raise ValueError(f"attention.prefill: q {q.shape} does not fit caches {k_cache.shape} "
                         f"(same head_dim in {HEAD_DIMS}, n_head a multiple of n_kv_head)")
    if start < 0 or start + tokens > max_len:
        raise ValueError(f"attention.prefill: positions {start}..{start + tokens - 1} do not fit "
                         f"a cache of max_len {max_len}")


def default_block_keys(head_dim: int) -> int:
    """64-key tiles (measured best at D 128 on the H200: 257 TFLOP/s vs 249 with 32), 32 at
    D 256, where 64 would spill registers."""
    return 32 if head_dim > 128 else 64


def launch_prefill(q, k_cache, v_cache, out, start: int, scale: float, *, window=None,
                   softcap=None, path: str | None = None, stream=None, block_keys=None,
                   warps: int = MMA_WARPS, stages: int | None = None, m_tiles: int = 1,
                   n_head: int | None = None, start_dev=None, sinks=None):
    """Causal attention of q (positions start..) against cache rows 0 .. start + tokens - 1.
    The mma path's tiling: block_keys keys per tile (default_block_keys), warps per block,
    stages of the cp.async ring (2..8, default MMA_STAGES), m_tiles 16-row query tiles per
    warp (1 or 2); the wgmma path's: block_keys and stages (prefill_wgmma.default_tiling).
    n_head (mma path): q is (tokens, W), its heads the first n_head * head_dim columns.
    start_dev: a device int32 added to `start` by the kernels (the runner's prefill graphs
    pass start 0 and the position buffer they replay with); the caller then guarantees
    start + start_dev[0] + tokens <= max_len, which only `start` is checked against here.
    sinks: None or (n_head,) float32 on the device, each head's sink logit (launch_decode's)."""
    _check_prefill_shapes(q, k_cache, v_cache, start, n_head)
    if start_dev is not None and (start_dev.dtype != np.int32 or start_dev.size < 1):
        raise ValueError(f"attention.prefill: start_dev must be a device int32 array, got "
                         f"{start_dev.dtype} {tuple(start_dev.shape)}")
    start_at = zero_i32() if start_dev is None else start_dev
    path = path or default_path(k_cache)
    tokens, n_head, head_dim, q_row = _q_geometry(q, k_cache, n_head)
    check_sinks(sinks, n_head, "attention.prefill")
    if path == "simt" and q.ndim == 2:
        raise ValueError("attention.prefill: the simt path takes q as (tokens, n_head, "
                         "head_dim) only")
    if path == "simt":   # row z is a decode query at position start + z
        keys = KeyRange(start_at, add=start + 1, step=1, stride=0, window=window)
        return launch_decode(q, k_cache, v_cache, keys, out, scale, softcap=softcap,
                             stream=stream, share_cache=True, sinks=sinks)
    if path == "wgmma":
        return launch_prefill_wgmma(q, k_cache, v_cache, out, start, scale, window=window,
                                    softcap=softcap, n_head=n_head if q.ndim == 2 else None,
                                    start_dev=start_dev, sinks=sinks, stream=stream,
                                    block_keys=block_keys, stages=stages)
    if path != "mma" or k_cache.dtype != np.float16:
        raise ValueError(f"attention.prefill: path {path!r} needs 'simt', or 'mma' / 'wgmma' "
                         f"with an f16 cache (cache is {k_cache.dtype})")
    _launch_flash(q, k_cache, v_cache, out, tokens, q_row, start, start_at, n_head, scale,
                  window, softcap, stream, block_keys, warps, stages or MMA_STAGES, m_tiles,
                  sinks=sinks)
    return out


def launch_prefill_seqs(q, k_pool, v_pool, out, seqs, scale: float, *, seqs_dev=None,
                        window=None, softcap=None, n_head: int | None = None, stream=None,
                        block_keys=None, warps: int = MMA_WARPS, stages: int = MMA_STAGES,
                        m_tiles: int = 1, sinks=None):
    """Prefill attention of several sequences in one launch (tensor cores, f16 caches of a
    pool: (slots, n_kv_head, max_len, D)). seqs: host int32 (n_seq, 4), a row per sequence:
    its first token row in q / out, its tokens, its first position, its slot; each sequence's
    cache slot must already hold its positions 0 .. start + tokens - 1 (rows of different
    sequences may share a slot only if they do not overlap). q / out / n_head as
    launch_prefill's. seqs_dev: the same table already on the device (e.g. uploaded once for
    every layer of a forward; trusted to equal seqs), else it is uploaded here. sinks: as
    launch_prefill's."""
    seqs = np.asarray(seqs)
    if k_pool.ndim != 4 or k_pool.shape != v_pool.shape or k_pool.dtype != np.float16 or \
            v_pool.dtype != np.float16:
        raise ValueError(f"attention.prefill_seqs: caches must both be f16 (slots, n_kv_head, "
                         f"max_len, head_dim), got {k_pool.shape} {k_pool.dtype} and "
                         f"{v_pool.shape} {v_pool.dtype}")
    slots, n_kv_head, max_len, head_dim = k_pool.shape
    tokens, n_head, _, q_row = _q_geometry(q, k_pool[0], n_head)
    check_sinks(sinks, n_head, "attention.prefill_seqs")
    if head_dim not in HEAD_DIMS or n_head % n_kv_head:
        raise ValueError(f"attention.prefill_seqs: q {q.shape} does not fit caches "
                         f"{k_pool.shape} (head_dim in {HEAD_DIMS}, n_head a multiple of "
                         f"n_kv_head)")
    if seqs.ndim != 2 or seqs.shape[1] != 4 or len(seqs) < 1 or \
            not np.issubdtype(seqs.dtype, np.integer):
        raise ValueError(f"attention.prefill_seqs: seqs must be integer (n_seq >= 1, 4), got "
                         f"{seqs.dtype} {seqs.shape}")
    first, count, start, slot = (seqs[:, i].astype(np.int64) for i in range(4))
    bad = (first < 0) | (count < 1) | (first + count > tokens) | (start < 0) | \
        (start + count > max_len) | (slot < 0) | (slot >= slots)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"attention.prefill_seqs: sequence {i} {seqs[i].tolist()} (first "
                         f"row, tokens, start, slot) does not fit q of {tokens} tokens and "
                         f"{slots} cache slots of max_len {max_len}")
    if seqs_dev is None:
        seqs_dev = pk.to_device(seqs.astype(np.int32))
    elif seqs_dev.dtype != np.int32 or seqs_dev.size != seqs.size:
        raise ValueError(f"attention.prefill_seqs: seqs_dev must be int32 of {seqs.size} "
                         f"values, got {seqs_dev.dtype} {seqs_dev.size}")
    _launch_flash(q, k_pool, v_pool, out, int(count.max()), q_row, 0, zero_i32(), n_head,
                  scale, window, softcap, stream, block_keys, warps, stages, m_tiles,
                  seqs=seqs_dev, n_seq=len(seqs), sinks=sinks)
    return out


def _launch_flash(q, k_cache, v_cache, out, tokens: int, q_row: int, start: int, start_at,
                  n_head: int, scale, window, softcap, stream, block_keys, warps, stages,
                  m_tiles, seqs=None, n_seq: int = 1, sinks=None):
    """prefill_flash over caches (n_kv_head, max_len, D), or a pool of them (slots first)
    with a sequence table seqs (VARLEN; grid z over its n_seq rows, x over `tokens`, the
    longest)."""
    head_dim = k_cache.shape[-1]
    bn = block_keys or default_block_keys(head_dim)
    if bn % 16 or not 16 <= bn <= 128 or not 1 <= warps <= 16 or not 2 <= stages <= 8 \
            or m_tiles not in (1, 2):
        raise ValueError(f"attention.prefill: block_keys {bn} must be a multiple of 16 in "
                         f"16..128, warps 1..16 (got {warps}), stages 2..8 (got {stages}), "
                         f"m_tiles 1 or 2 (got {m_tiles})")
    n_kv_head, max_len, _ = k_cache.shape[-3:]
    use_softcap = softcap is not None and softcap > 0
    q_scale = float(scale) if use_softcap else float(scale) * LOG2E
    rows = tokens * (n_head // n_kv_head)
    grid = (-(-rows // (16 * m_tiles * warps)), n_kv_head, n_seq)
    shared = stages * 2 * bn * (head_dim // 2 + 4) * 4     # the ring: K + V tiles per stage
    prefill_flash[grid, 32 * warps, stream, shared](
        q, k_cache.view(np.uint32), v_cache.view(np.uint32), out, tokens, q_row,
        start, start_at, max_len, n_head, n_kv_head, q_scale,
        float(softcap) if use_softcap else 0.0, int(window or 0),
        start_at if seqs is None else seqs, D=head_dim, BN=bn, NWARPS=warps, STAGES=stages,
        MT=m_tiles, VARLEN=seqs is not None, sinks=out.reshape(-1) if sinks is None else sinks,
        SINK=sinks is not None)
