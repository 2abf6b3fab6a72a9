"""Float64 numpy reference for attention: softmax(Q K^T * scale + mask) V, the oracle the
kernels are tested against.

Input: q (tokens, n_head, head_dim), k/v (kv_tokens, n_kv_head, head_dim) where the last
`tokens` key positions are the queries' own (causal); optional sliding `window` (a query at
position p sees keys p - window + 1 .. p) and logit soft-capping (softcap * tanh(s / softcap),
applied after scaling, before the mask); optional `sinks` (n_head,): head h's softmax has one
more logit sinks[h] (not scaled, no value; gpt-oss).
Output: float64 (tokens, n_head, head_dim).
"""
from __future__ import annotations

import numpy as np


def attention_reference(q, k, v, scale, window=None, softcap=None, sinks=None) -> np.ndarray:
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    tokens, n_head, _ = q.shape
    kv_tokens, n_kv_head, _ = k.shape
    group = n_head // n_kv_head
    start = kv_tokens - tokens            # position of the first query
    q_pos = start + np.arange(tokens)[:, None]
    k_pos = np.arange(kv_tokens)[None, :]
    visible = k_pos <= q_pos
    if window is not None:
        visible &= k_pos > q_pos - window
    out = np.empty(q.shape, dtype=np.float64)
    for h in range(n_head):
        kv = h // group                   # grouped-query attention: consecutive q heads share
        scores = q[:, h, :] @ k[:, kv, :].T * scale
        if softcap is not None:
            scores = softcap * np.tanh(scores / softcap)
        scores = np.where(visible, scores, -np.inf)
        sink = -np.inf if sinks is None else float(sinks[h])
        top = np.maximum(scores.max(axis=1, keepdims=True), sink)
        weights = np.exp(scores - top)
        weights /= weights.sum(axis=1, keepdims=True) + np.exp(sink - top)
        out[:, h, :] = weights @ v[:, kv, :]
    return out


def decode_reference(q, k_cache, v_cache, kv_len, scale, window=None, softcap=None,
                     sinks=None):
    """q (n_head, head_dim), caches (n_kv_head, max_len, head_dim): the query is at position
    kv_len - 1 and sees cache rows 0 .. kv_len - 1. Returns float64 (n_head, head_dim)."""
    k = np.asarray(k_cache)[:, :kv_len, :].transpose(1, 0, 2)
    v = np.asarray(v_cache)[:, :kv_len, :].transpose(1, 0, 2)
    return attention_reference(np.asarray(q)[None], k, v, scale, window, softcap, sinks)[0]


def relative_l2(actual, expected) -> float:
    expected = np.asarray(expected, dtype=np.float64)
    diff = np.asarray(actual, dtype=np.float64) - expected
    return float(np.linalg.norm(diff) / max(np.linalg.norm(expected), 1e-300))
