"""The mixture-of-experts router: per token, the router logits -> the top-k expert ids and
their weights, in one launch (one warp per token row; ids stay on the device).

    route(logits, k, mode, bias=None) -> (ids i32 (tokens, k), weights f32 (tokens, k))
    route_into(logits, ids, weights, k, mode, bias=None, stream=None)   preallocated
    route_reference(logits, k, mode, bias=None)                         numpy, the same

logits: f32 (tokens, n_expert), the gate matmul's output (`ffn_gate_inp` @ x, any format).
bias: f32 (n_expert,) or None, added to every row first (gpt-oss's `ffn_gate_inp.bias`).
Modes (llama.cpp's build_moe_ffn):
- "softmax_norm" (qwen3moe): p = softmax over all experts; the k largest p; weights = those p
  divided by their sum (the sum clamped below at 2^-14, as llama.cpp's clamp to the smallest
  normal f16).
- "softmax" (qwen2moe style, no renormalisation): the k largest p as they are.
- "topk_softmax" (gpt-oss): the k largest logits; weights = softmax over those k.
The ids come largest first. Ties go to the lower expert index, as in llama.cpp's fused CUDA
router (topk-moe.cu: an iterative warp argmax preferring the lower index); its CPU path
(ggml_argsort_top_k: std::sort, unstable) leaves the order of exactly equal values
unspecified. Softmax is monotonic, so selecting on the
logits selects the same experts as llama.cpp's selection on p except where two logits round
to the same p. NaN logits are never selected.
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32

from .._select import better, warp_argmax
from ..collectives import SUM, warp_reduce

MODES = {"softmax_norm": 0, "softmax": 1, "topk_softmax": 2}
SOFTMAX_NORM, SOFTMAX, TOPK_SOFTMAX = 0, 1, 2
NORM_FLOOR = 6.103515625e-5        # llama.cpp clamps the renormalising sum to this (2^-14)
MAX_K = 32
NEG_INF = float("-inf")


@pk.kernel
def router_kernel(logits: Ptr[f32, "ro"], bias: Ptr[f32, "ro"], ids: Ptr[i32],
                  weights: Ptr[f32], n_expert: i32, K: Const[int], MODE: Const[int],
                  HAS_BIAS: Const[bool], PER_LANE: Const[int]):
    # grid (tokens,), 32 threads; lane l holds experts l, l + 32, ... (PER_LANE of them)
    lane = pk.thread_idx.x
    row = pk.block_idx.x
    vals = pk.local_array(f32, PER_LANE)
    for s in pk.static_range(PER_LANE):
        e = lane + 32 * s
        vals[s] = NEG_INF
        if e < n_expert:
            v = logits[row * n_expert + e]
            if HAS_BIAS:
                v = v + bias[e]
            if v == v:          # NaN is never selected
                vals[s] = v
    taken = u32(0)
    chosen = pk.local_array(f32, K)
    for j in pk.static_range(K):
        bv = f32(NEG_INF)
        bi = i32(0x7FFFFFFF)
        for s in pk.static_range(PER_LANE):
            e = lane + 32 * s
            if e < n_expert and (taken >> u32(s)) & u32(1) == u32(0) and \
                    better(vals[s], e, bv, bi):
                bv = vals[s]
                bi = e
        bv, bi = warp_argmax(bv, bi)
        if bi % 32 == lane:
            taken = taken | (u32(1) << u32(bi // 32))
        chosen[j] = bv
        if lane == 0:
            ids[row * K + j] = bi
    store_weights(vals, chosen, weights, row, n_expert, K, MODE, PER_LANE)


@pk.func
def store_weights(vals, chosen, weights: Ptr[f32], row: i32, n_expert: i32, K: Const[int],
                  MODE: Const[int], PER_LANE: Const[int]):
    """The k weights from the chosen values (chosen[0] is the row's maximum)."""
    lane = pk.thread_idx.x
    top = chosen[0]
    denom = f32(0.0)
    if MODE == TOPK_SOFTMAX:
        for j in pk.static_range(K):
            denom += pk.exp(chosen[j] - top)
    else:
        part = f32(0.0)
        for s in pk.static_range(PER_LANE):
            if lane + 32 * s < n_expert:
                part += pk.exp(vals[s] - top)
        denom = warp_reduce(part, SUM)
    inv = 1.0 / denom
    probs = pk.local_array(f32, K)
    norm = f32(0.0)
    for j in pk.static_range(K):
        probs[j] = pk.exp(chosen[j] - top) * inv
        norm += probs[j]
    if lane == 0:
        for j in pk.static_range(K):
            w = probs[j]
            if MODE == SOFTMAX_NORM:
                w = w / max(norm, NORM_FLOOR)
            weights[row * K + j] = w


def _check(logits, k: int, mode: str, bias):
    if mode not in MODES:
        raise ValueError(f"route: mode must be one of {', '.join(MODES)}, got {mode!r}")
    if logits.dtype != np.float32 or logits.ndim != 2:
        raise ValueError(f"route: logits must be float32 (tokens, n_expert), got "
                         f"{logits.dtype} {tuple(logits.shape)}")
    n_expert = logits.shape[1]
    if not 1 <= k <= min(n_expert, MAX_K):
        raise ValueError(f"route: k = {k} must be in 1..{min(n_expert, MAX_K)} for "
                         f"{n_expert} experts")
    if n_expert > 32 * 32:
        raise ValueError(f"route: at most 1024 experts, got {n_expert}")
    if bias is not None and (bias.dtype != np.float32 or bias.size != n_expert):
        raise ValueError(f"route: bias must be float32 with {n_expert} values, got "
                         f"{bias.dtype} {tuple(bias.shape)}")


def route_into(logits, ids, weights, k: int, mode: str, bias=None, stream=None) -> None:
    """ids (tokens, k) i32 and weights (tokens, k) f32 from device logits (tokens, n_expert)."""
    _check(logits, k, mode, bias)
    tokens, n_expert = logits.shape
    for out, dtype, name in ((ids, np.int32, "ids"), (weights, np.float32, "weights")):
        if out.dtype != dtype or out.size != tokens * k:
            raise ValueError(f"route: {name} must be {np.dtype(dtype)} with {tokens}x{k} "
                             f"elements, got {out.dtype} {tuple(out.shape)}")
    per_lane = (n_expert + 31) // 32
    router_kernel[tokens, 32, stream](logits, logits if bias is None else bias, ids, weights,
                                      n_expert, k, MODES[mode], bias is not None, per_lane)


def route(logits, k: int, mode: str, bias=None):
    """(ids, weights) device arrays for numpy or device logits (module docstring)."""
    logits = _device_f32(logits)
    bias = None if bias is None else _device_f32(bias)
    ids = pk.empty((logits.shape[0], k), np.int32)
    weights = pk.empty((logits.shape[0], k), np.float32)
    route_into(logits, ids, weights, k, mode, bias)
    return ids, weights


def _device_f32(a):
    if isinstance(a, pk.Array):
        return a
    return pk.to_device(np.ascontiguousarray(a, dtype=np.float32))


def route_reference(logits: np.ndarray, k: int, mode: str, bias=None):
    """numpy (ids (tokens, k) int32, weights (tokens, k) float32), computed in float64."""
    _check(np.asarray(logits, np.float32), k, mode, bias)
    z = np.asarray(logits, np.float64) + (0 if bias is None else np.asarray(bias, np.float64))
    z = np.where(np.isnan(z), -np.inf, z)
    order = np.argsort(-z, axis=1, kind="stable")[:, :k]      # ties: lower index first
    top = np.take_along_axis(z, order, axis=1)
    if mode == "topk_softmax":
        e = np.exp(top - top[:, :1])
        w = e / e.sum(axis=1, keepdims=True)
    else:
        p = np.exp(top - top[:, :1]) / np.exp(z - top[:, :1]).sum(axis=1, keepdims=True)
        w = p / np.maximum(p.sum(axis=1, keepdims=True), NORM_FLOOR) \
            if mode == "softmax_norm" else p
    return order.astype(np.int32), w.astype(np.float32)
