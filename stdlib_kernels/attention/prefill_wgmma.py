"""Host side of prefill attention on Hopper's wgmma (FlashAttention-3's structure; the kernel
and its layout are in prefill_wgmma_kernel.py): a block of new tokens attending causally to an
f16 KV cache that already holds their own keys and values.

Input: device arrays: q (tokens, n_head, D) f32, or (tokens, W) f32 with n_head given (a fused
q|k|v projection's rows, its first n_head * D columns the heads), queries at positions start
(+ start_dev[0] on the device) ..; K / V caches (n_kv_head, max_len, D) f16 holding positions
0 .. start + tokens - 1; a preallocated out (tokens, n_head, D) f32.
Output: the attention result in `out`, the same as prefill.launch_prefill's "mma" path (Q, K,
V and P rounded to f16, f32 accumulation) up to the order of the sums.

Serves head_dim 64 and 128, any GQA group, causal masks with an optional sliding window,
soft-capping and sinks (the mma path's options), on sm_90 GPUs (the kernel is compiled for
sm_90a) and the CPU target. One sequence per launch (launch_prefill_seqs keeps the mma path).
"""
from __future__ import annotations

import numpy as np

import pykernel as pk

from .._launch import zero_i32
from .decode_kernels import LOG2E
from .decode_plan import cuda_sm
from ..gemm_hopper_kernel import SWIZZLE_ALIGN
from .prefill_wgmma_kernel import BOX_DIMS, ROWS, THREADS, prefill_wgmma

__all__ = [
    "WGMMA_HEAD_DIMS",
    "default_tiling",
    "launch_prefill_wgmma",
    "shared_bytes",
    "wgmma_prefill_applies",
]

WGMMA_HEAD_DIMS = (64, 128)
SHARED_LIMIT = 227 * 1024          # dynamic + static shared memory of one block (H100 / H200)


def wgmma_prefill_applies(head_dim: int, dtype, device=None) -> bool:
    """Where the kernel runs: f16 caches of head_dim 64 / 128 on an sm_90 GPU (wgmma needs
    sm_90a: not sm_100 or sm_120) or on the CPU target (its emulation)."""
    device = device or pk.current_device()
    on_device = cuda_sm(device) == 90 or device.kind == "cpu"
    return on_device and np.dtype(dtype) == np.float16 and head_dim in WGMMA_HEAD_DIMS


def shared_bytes(head_dim: int, block_keys: int, stages: int) -> int:
    """Dynamic shared memory of a launch: the ring (K and V tiles per stage) and the
    1024-byte alignment pad."""
    return stages * 2 * block_keys * head_dim * 2 + SWIZZLE_ALIGN


def default_tiling(head_dim: int) -> tuple[int, int]:
    """(block_keys, stages): 128-key tiles in 2 stages at D 128 (128 KiB; FlashAttention-3's
    tile on the H100), 4 at D 64. Not tuned on a GPU yet."""
    return (128, 2) if head_dim > 64 else (128, 4)


def _check(q, k_cache, v_cache, out, start: int, n_head, block_keys: int, stages: int):
    """(tokens, n_head, head_dim, q_row) after the argument checks."""
    if k_cache.ndim != 3 or k_cache.shape != v_cache.shape or \
            k_cache.dtype != np.float16 or v_cache.dtype != np.float16:
        raise ValueError(f"attention.prefill_wgmma: caches must both be f16 (n_kv_head, "
                         f"max_len, head_dim), got {tuple(k_cache.shape)} {k_cache.dtype} and "
                         f"{tuple(v_cache.shape)} {v_cache.dtype}")
    n_kv_head, max_len, head_dim = k_cache.shape
    if q.dtype != np.float32 or q.ndim not in (2, 3) or (q.ndim == 2) != (n_head is not None):
        raise ValueError(f"attention.prefill_wgmma: q must be (tokens, n_head, head_dim) "
                         f"float32, or (tokens, W) float32 with n_head given, got "
                         f"{tuple(q.shape)} {q.dtype} (n_head {n_head})")
    tokens = q.shape[0]
    if q.ndim == 3:
        n_head, q_row = q.shape[1], q.shape[1] * q.shape[2]
        if q.shape[2] != head_dim:
            raise ValueError(f"attention.prefill_wgmma: q {tuple(q.shape)} and caches "
                             f"{tuple(k_cache.shape)} differ in head_dim")
    else:
        q_row = q.shape[1]
    if head_dim not in WGMMA_HEAD_DIMS or n_head % n_kv_head or n_head * head_dim > q_row:
        raise ValueError(f"attention.prefill_wgmma: q {tuple(q.shape)} ({n_head} heads) does "
                         f"not fit caches {tuple(k_cache.shape)}: head_dim must be one of "
                         f"{WGMMA_HEAD_DIMS}, n_head a multiple of n_kv_head")
    if tuple(out.shape) != (tokens, n_head, head_dim) or out.dtype != np.float32:
        raise ValueError(f"attention.prefill_wgmma: out must be ({tokens}, {n_head}, "
                         f"{head_dim}) float32, got {tuple(out.shape)} {out.dtype}")
    if start < 0 or start + tokens > max_len:
        raise ValueError(f"attention.prefill_wgmma: positions {start}..{start + tokens - 1} "
                         f"do not fit a cache of max_len {max_len}")
    if block_keys % 16 or not 16 <= block_keys <= 256 or stages < 1 or \
            shared_bytes(head_dim, block_keys, stages) > SHARED_LIMIT - 24 * stages:
        raise ValueError(f"attention.prefill_wgmma: block_keys {block_keys} must be a "
                         f"multiple of 16 in 16..256 and {stages} stages of K and V tiles "
                         f"must fit {SHARED_LIMIT} bytes of shared memory")
    return tokens, n_head, head_dim, q_row


def launch_prefill_wgmma(q, k_cache, v_cache, out, start: int, scale: float, *, window=None,
                         softcap=None, n_head: int | None = None, start_dev=None, sinks=None,
                         stream=None, block_keys: int | None = None,
                         stages: int | None = None):
    """Causal attention of q (positions start..) against cache rows 0 .. start + tokens - 1,
    into out. window: keys within the last `window` positions (None / 0: all); softcap: the
    scores' tanh cap; start_dev: a device int32 added to `start` by the kernel (graphs; the
    caller guarantees the positions fit); sinks: None or (n_head,) f32 on the device, each
    head's sink logit. block_keys / stages: the K / V tile and ring depth (default_tiling).
    Returns out."""
    bn_default, stages_default = default_tiling(k_cache.shape[-1])
    bn, stages = block_keys or bn_default, stages or stages_default
    tokens, n_head, head_dim, q_row = _check(q, k_cache, v_cache, out, start, n_head, bn,
                                             stages)
    if start_dev is not None and (start_dev.dtype != np.int32 or start_dev.size < 1):
        raise ValueError(f"attention.prefill_wgmma: start_dev must be a device int32 array, "
                         f"got {start_dev.dtype} {tuple(start_dev.shape)}")
    if sinks is not None and (not isinstance(sinks, pk.Array) or sinks.dtype != np.float32
                              or sinks.size != n_head):
        raise ValueError(f"attention.prefill_wgmma: sinks must be a device float32 array of "
                         f"n_head = {n_head} values")
    n_kv_head = k_cache.shape[0]
    use_softcap = softcap is not None and softcap > 0
    q_scale = float(scale) if use_softcap else float(scale) * LOG2E
    tk = pk.tensor_map(k_cache, (1, bn, BOX_DIMS), swizzle=128)
    tv = pk.tensor_map(v_cache, (1, bn, BOX_DIMS), swizzle=128)
    grid = (-(-tokens * (n_head // n_kv_head) // ROWS), n_kv_head)
    prefill_wgmma[grid, THREADS, stream, shared_bytes(head_dim, bn, stages)](
        tk, tv, q, out, tokens, q_row, start, zero_i32() if start_dev is None else start_dev,
        n_head, n_kv_head, q_scale, float(softcap) if use_softcap else 0.0, int(window or 0),
        out.reshape(-1) if sinks is None else sinks, D=head_dim, BN=bn, STAGES=stages,
        SINK=sinks is not None)
    return out
