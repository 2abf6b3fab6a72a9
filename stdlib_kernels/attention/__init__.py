"""Attention over a KV cache, written in pykernel: decode (flash-decoding, split-K + combine)
and prefill (tiled flash attention, tensor cores on sm_80+). See docs/stdlib.md "## Attention".

Contract API (numpy in -> numpy out; pykernel Arrays in -> pykernel Array out):
    decode(q, k_cache, v_cache, kv_len, scale, window=None, softcap=None)
        q (n_head, D), caches (n_kv_head, max_len, D) f16/f32, or Q8Cache from
        quantize_kv (Q8_0, D % 32 == 0; tensor-core kernel) -> (n_head, D) f32
    prefill(q, k, v, scale, window=None, softcap=None)
        q (tokens, n_head, D), k/v (kv_tokens, n_kv_head, D), the last `tokens` positions the
        queries' own (causal) -> (tokens, n_head, D) f32
Runner entry points (preallocated outputs, lengths on the device, graph-capturable):
    launch_decode (the keys per row: KeyRange), DecodeWorkspace (decode.py); DecodeConfig,
    default_config, config_splits, plan_splits, batch_splits (decode_plan.py); launch_prefill,
    launch_prefill_seqs (prefill.py).
"""
from __future__ import annotations

import numpy as np

import pykernel as pk

from .decode import DecodeWorkspace, KeyRange, launch_decode
from .decode_plan import DecodeConfig, batch_splits, config_splits, default_config, plan_splits
from .kv_q8 import Q8Cache, dequantize_kv, quantize_kv
from .prefill import launch_prefill, launch_prefill_seqs
from .reference import attention_reference, decode_reference

__all__ = ["decode", "prefill", "launch_decode", "KeyRange", "launch_prefill",
           "launch_prefill_seqs",
           "DecodeWorkspace", "DecodeConfig", "plan_splits", "batch_splits",
           "attention_reference", "decode_reference", "Q8Cache", "quantize_kv",
           "dequantize_kv"]


def _on_device(x, dtype=None):
    if isinstance(x, pk.Array):
        return x if dtype is None or x.dtype == dtype else pk.to_device(x.numpy().astype(dtype))
    x = np.asarray(x)
    return pk.to_device(x if dtype is None else x.astype(dtype))


def _cache_dtype(x):
    return x.dtype if x.dtype in (np.float16, np.float32) else np.dtype(np.float32)


def decode(q, k_cache, v_cache, kv_len: int, scale: float, window=None, softcap=None):
    """One query token per head at position kv_len - 1 against cache rows 0 .. kv_len - 1."""
    as_array = isinstance(q, pk.Array)
    n_head, head_dim = q.shape
    max_len = k_cache.shape[1]
    if not 1 <= int(kv_len) <= max_len:
        raise ValueError(f"attention.decode: kv_len {kv_len} must be in 1..{max_len} "
                         f"(the cache's max_len)")
    qd = _on_device(q, np.float32).reshape(1, n_head, head_dim)
    if isinstance(k_cache, Q8Cache):       # already on the device (quantize_kv)
        dtype, kd, vd = k_cache.dtype, k_cache, v_cache
    else:
        dtype = _cache_dtype(k_cache)
        kd, vd = _on_device(k_cache, dtype), _on_device(v_cache, dtype)
    lens = pk.to_device(np.array([kv_len], np.int32))
    out = pk.empty((1, n_head, head_dim), np.float32)
    config = default_config(n_head // kd.shape[0], head_dim, dtype=dtype)
    visible = int(kv_len) - (0 if not window else max(0, kv_len - window))
    splits = config_splits(config, n_head, kd.shape[0], visible)
    workspace = DecodeWorkspace.allocate(1, n_head, head_dim, splits) if splits > 1 else None
    launch_decode(qd, kd, vd, KeyRange(lens, window=window), out, scale, softcap=softcap,
                  workspace=workspace, config=config)
    out = out.reshape(n_head, head_dim)
    return out if as_array else out.numpy()


def prefill(q, k, v, scale: float, window=None, softcap=None, path=None):
    """Causal attention of `tokens` queries against kv_tokens keys (the last `tokens` are the
    queries' own positions). k/v are transposed to the cache layout on the host."""
    as_array = isinstance(q, pk.Array)
    tokens = q.shape[0]
    k_host = k.numpy() if isinstance(k, pk.Array) else np.asarray(k)
    v_host = v.numpy() if isinstance(v, pk.Array) else np.asarray(v)
    if k_host.ndim != 3 or k_host.shape != v_host.shape or k_host.shape[0] < tokens:
        raise ValueError(f"attention.prefill: k {k_host.shape} and v {v_host.shape} must be "
                         f"(kv_tokens >= tokens={tokens}, n_kv_head, head_dim)")
    dtype = _cache_dtype(k_host)
    kd = pk.to_device(np.ascontiguousarray(k_host.transpose(1, 0, 2), dtype=dtype))
    vd = pk.to_device(np.ascontiguousarray(v_host.transpose(1, 0, 2), dtype=dtype))
    qd = _on_device(q, np.float32)
    out = pk.empty(tuple(q.shape), np.float32)
    launch_prefill(qd, kd, vd, out, k_host.shape[0] - tokens, scale, window=window,
                   softcap=softcap, path=path)
    return out if as_array else out.numpy()
