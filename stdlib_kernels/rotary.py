"""Rotary position embeddings (RoPE), normal (adjacent pairs, llama) and NEOX (pairs i and
i + rot_dim/2; qwen2/qwen3/gemma3), and the fused "RoPE q, RoPE k and write k, v into the KV
cache" kernel used by the decode step, with numpy references. The kernels themselves are in
rotary_kernels.py; this module checks arguments and launches them.

Input: x (tokens, heads, head_dim) f32/f16; positions (tokens,) int32 on the device (read by
the kernel, so a captured CUDA graph replays with new positions); theta (the frequency base,
per call: Gemma 3 uses two); rot_dim (rotate the first rot_dim dims, copy the rest);
freq_factors (rot_dim/2,) f32 dividing each frequency (Llama 3.1 `rope_freqs`); `rope` takes
them as arguments, the fused `rope_kv_cache*` as one `RopeSpec` (and qwen3's per-head norms
as `HeadNorms`).
KV cache: (n_kv_head, max_len, head_dim) f32 or f16, or a Q8_0 cache (attention.Q8Cache, head_dim
a multiple of 32, at most 256; quantized as ggml does); token t's k, v go to slot
positions[t] + pos_offset (slots outside [0, max_len) are skipped, not written).

Angle for pair i at position p: p * theta^(-2i/rot_dim) / freq_factor[i], computed in f32 as
llama.cpp does, so its absolute error grows like p * 2^-24 rad; sin/cos are the accurate ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import pykernel as pk

from . import _launch as L
from .attention.kv_q8 import Q8Cache, check_pair as check_q8_pair
from .rotary_kernels import rope_heads, rope_qkv_cache


@dataclass(frozen=True)
class RopeSpec:
    """How positions become rotations: the frequency base theta, "normal" (adjacent pairs) or
    "neox" pairs, the rotated dims (None: all of head_dim), Llama 3.1's freq_factors
    ((rot_dim/2,) f32 dividing each frequency), an offset added to every position, and a
    magnitude scale of cos and sin (YaRN's; its frequency mix is a per-pair factor, so it
    travels as freq_factors)."""
    theta: float = 10000.0
    style: str = "normal"
    rot_dim: int | None = None
    freq_factors: object = None
    pos_offset: int = 0
    mscale: float = 1.0


@dataclass(frozen=True)
class HeadNorms:
    """Per-head RMSNorm before the rotation (qwen3 / gemma3's q_norm / k_norm): weights
    (head_dim,) f32 for the q heads and the k heads, and the norm's eps."""
    q_norm: object
    k_norm: object
    eps: float = 1e-6


@dataclass(frozen=True)
class _QKVRows:
    """The heads one rope_qkv_cache launch reads, as flat device arrays: token t's q heads at
    q + t q_row, rotated into q_out + t q_out_row (q itself, or a separate buffer), its k / v
    heads at k / v + t kv_row. has_q False: k and v only."""
    q: object
    k: object
    v: object
    tokens: int
    q_heads: int
    kv_heads: int
    head_dim: int
    q_row: int
    kv_row: int
    q_out: object
    q_out_row: int
    has_q: bool = True


def _check_heads(x, name: str) -> tuple[int, int, int]:
    if x.ndim != 3:
        raise ValueError(f"{name}: expected (tokens, heads, head_dim), got shape {x.shape}")
    if x.dtype not in (np.float32, np.float16):
        raise TypeError(f"{name}: expected float32 or float16, got {x.dtype}")
    return x.shape


def _resolve(spec: RopeSpec, head_dim: int, name: str) -> RopeSpec:
    """spec with rot_dim an int and freq_factors a device f32 array (or None), checked."""
    if not isinstance(spec, RopeSpec):
        raise TypeError(f"{name}: spec must be a RopeSpec, got {type(spec).__name__}")
    if spec.style not in ("normal", "neox"):
        raise ValueError(f"{name}: style must be 'normal' or 'neox', got {spec.style!r}")
    rot_dim = head_dim if spec.rot_dim is None else int(spec.rot_dim)
    if rot_dim % 2 or not 0 < rot_dim <= head_dim:
        raise ValueError(f"{name}: rot_dim must be even and in (0, {head_dim}], got {rot_dim}")
    ff = spec.freq_factors
    if ff is not None:
        ff = L.as_array(ff, f"{name}: freq_factors", np.float32)
        if ff.size < rot_dim // 2:
            raise ValueError(f"{name}: freq_factors has {ff.size} entries, needs {rot_dim // 2}")
    return RopeSpec(spec.theta, spec.style, rot_dim, ff, spec.pos_offset, float(spec.mscale))


def _positions(positions, tokens: int, name: str):
    pos = L.as_array(positions, f"{name}: positions", np.int32)
    if pos.size != tokens:
        raise ValueError(f"{name}: {pos.size} positions for {tokens} tokens")
    return pos


def rope(x, positions, theta: float = 10000.0, style: str = "normal", *, rot_dim=None,
         freq_factors=None, pos_offset: int = 0, mscale: float = 1.0, out=None, stream=None):
    """RoPE over x (tokens, heads, head_dim); `out=x` rotates in place; mscale multiplies the
    rotated dims' cos and sin (YaRN)."""
    x = L.as_array(x, "rope: x")
    tokens, heads, head_dim = _check_heads(x, "rope: x")
    pos = _positions(positions, tokens, "rope")
    spec = _resolve(RopeSpec(theta, style, rot_dim, freq_factors, pos_offset, mscale), head_dim,
                    "rope")
    out = L.output(out, "rope", x.shape, x.dtype)
    ff = spec.freq_factors if spec.freq_factors is not None else L.dummy(np.float32)
    args = (x, out, pos, ff, heads, head_dim, spec.rot_dim, pos_offset, math.log2(theta),
            spec.mscale)
    consts = (("HAS_FF", freq_factors is not None), ("NEOX", style == "neox"),
              ("T", x.dtype))
    L.launch(rope_heads, (tokens, heads, 1), L.threads_for(spec.rot_dim // 2, 256), args,
             consts, stream)
    return out


def rope_kv_cache(k, v, cache_k, cache_v, positions, spec: RopeSpec = RopeSpec(), *, q=None,
                  norms: HeadNorms | None = None, stream=None):
    """One launch: RoPE q in place (if given), RoPE k into cache_k[:, pos] and copy v into
    cache_v[:, pos] (pos = positions[t] + spec.pos_offset). Caches: (n_kv_head, max_len,
    head_dim). norms: each q and k head is first RMS-normalized and scaled by its weights
    (qwen3 / gemma3), in the same launch."""
    k, v = L.as_array(k, "rope_kv_cache: k"), L.as_array(v, "rope_kv_cache: v")
    tokens, kv_heads, head_dim = _check_heads(k, "rope_kv_cache: k")
    if v.shape != k.shape or v.dtype != k.dtype:
        raise ValueError(f"rope_kv_cache: v is {v.shape} {v.dtype}, k is {k.shape} {k.dtype}")
    _check_caches(cache_k, cache_v, kv_heads, head_dim, "rope_kv_cache")
    q_heads = 0
    if q is not None:
        q = L.as_array(q, "rope_kv_cache: q", k.dtype)
        qt, q_heads, qd = _check_heads(q, "rope_kv_cache: q")
        if qt != tokens or qd != head_dim:
            raise ValueError(f"rope_kv_cache: q shape {q.shape} does not match k {k.shape}")
    pos = _positions(positions, tokens, "rope_kv_cache")
    spec = _resolve(spec, head_dim, "rope_kv_cache")
    q_src = L.either(q, k)
    rows = _QKVRows(q_src, k, v, tokens, q_heads, kv_heads, head_dim, q_heads * head_dim,
                    kv_heads * head_dim, q_src, q_heads * head_dim, q is not None)
    _launch_qkv(rows, cache_k, cache_v, pos, spec,
                _head_norms(norms, head_dim, "rope_kv_cache"), None, stream)


def rope_kv_cache_cols(qkv, q_heads: int, kv_heads: int, head_dim: int, cache_k, cache_v,
                       positions, spec: RopeSpec = RopeSpec(), *, norms: HeadNorms | None = None,
                       q_out=None, slots=None, slots_dev=None, stream=None) -> None:
    """rope_kv_cache on a fused projection's output read in place: qkv (tokens, W) float32
    holds q | k | v heads in its first (q_heads + 2 kv_heads) head_dim columns; q is rotated
    there (or into q_out, (tokens, q_heads * head_dim) float32, leaving qkv's q as it is), k
    rotated into cache_k, v copied into cache_v (no copies of the columns). Caches of one
    sequence, (kv_heads, max_len, head_dim), or f16 / f32 caches of one sequence per token,
    (tokens, kv_heads, max_len, head_dim): token t's rows go to cache_k[t] / cache_v[t] at
    its own position (batched decode). slots: host ints, a cache slot per token, for f16 / f32
    caches of (n_slots, kv_heads, max_len, head_dim): token t's rows go to slot slots[t]
    (several prompts' tokens in one pass; slots_dev: the same values already on the device,
    int32, trusted to equal them). spec, norms: as rope_kv_cache's."""
    qkv = L.as_array(qkv, "rope_kv_cache_cols: qkv")
    nq, nkv = q_heads * head_dim, kv_heads * head_dim
    if qkv.ndim != 2 or qkv.dtype != np.float32 or qkv.shape[1] < nq + 2 * nkv:
        raise ValueError(f"rope_kv_cache_cols: qkv must be float32 (tokens, >= {nq + 2 * nkv})"
                         f" for {q_heads} + 2 x {kv_heads} heads of {head_dim}, got "
                         f"{qkv.dtype} {tuple(qkv.shape)}")
    tokens, width = qkv.shape
    if slots is not None:
        slots, slots_dev = _slot_table(slots, slots_dev, tokens, cache_k)
    _check_caches(cache_k, cache_v, kv_heads, head_dim, "rope_kv_cache_cols", tokens,
                  slots is not None)
    pos = _positions(positions, tokens, "rope_kv_cache_cols")
    spec = _resolve(spec, head_dim, "rope_kv_cache_cols")
    flat = qkv.reshape(-1)
    q_dst, q_dst_row = flat, width
    if q_out is not None:
        q_out = L.as_array(q_out, "rope_kv_cache_cols: q_out")
        if q_out.dtype != np.float32 or q_out.size != tokens * nq:
            raise ValueError(f"rope_kv_cache_cols: q_out must be float32 ({tokens}, {nq}), got "
                             f"{q_out.dtype} {tuple(q_out.shape)}")
        q_dst, q_dst_row = q_out.reshape(-1), nq
    rows = _QKVRows(flat, flat[nq:], flat[nq + nkv:], tokens, q_heads, kv_heads, head_dim,
                    width, width, q_dst, q_dst_row)
    _launch_qkv(rows, cache_k, cache_v, pos, spec,
                _head_norms(norms, head_dim, "rope_kv_cache_cols"), slots_dev, stream)


def _slot_table(slots, slots_dev, tokens: int, cache_k):
    """(host slots, device int32 slots) of rope_kv_cache_cols, checked against the caches."""
    slots = np.asarray(slots)
    n_slots = cache_k.shape[0] if getattr(cache_k, "ndim", 0) == 4 else 0
    if slots.shape != (tokens,) or not np.issubdtype(slots.dtype, np.integer) or \
            (tokens and (slots.min() < 0 or slots.max() >= n_slots)):
        raise ValueError(f"rope_kv_cache_cols: slots must be {tokens} ints in 0..{n_slots - 1}"
                         f" (a slot of (n_slots, kv_heads, max_len, head_dim) caches per "
                         f"token), got {slots.dtype} {slots.shape}")
    if slots_dev is None:
        slots_dev = pk.to_device(slots.astype(np.int32))
    elif slots_dev.dtype != np.int32 or slots_dev.size != tokens:
        raise ValueError(f"rope_kv_cache_cols: slots_dev must be {tokens} int32, got "
                         f"{slots_dev.dtype} {slots_dev.size}")
    return slots, slots_dev


def _head_norms(norms: HeadNorms | None, head_dim: int, name: str) -> HeadNorms | None:
    """norms with device f32 weights of head_dim each, or None for no per-head norm."""
    if norms is None:
        return None
    if not isinstance(norms, HeadNorms) or norms.q_norm is None or norms.k_norm is None:
        raise ValueError(f"{name}: norms must be HeadNorms(q_norm, k_norm, eps) with both "
                         f"weights, got {norms!r}")
    weights = {}
    for what in ("q_norm", "k_norm"):
        w = L.as_array(getattr(norms, what), f"{name}: {what}", np.float32)
        if w.size != head_dim:
            raise ValueError(f"{name}: {what} has {w.size} values, expected head_dim "
                             f"{head_dim}")
        weights[what] = w
    return HeadNorms(eps=float(norms.eps), **weights)


def _launch_qkv(rows: _QKVRows, cache_k, cache_v, pos, spec: RopeSpec,
                norms: HeadNorms | None, slots, stream) -> None:
    """One rope_qkv_cache launch; spec resolved (_resolve), norms on the device (_head_norms),
    slots: device int32 cache slots per token, or None."""
    ff = spec.freq_factors if spec.freq_factors is not None else L.dummy(np.float32)
    qn, kn = (norms.q_norm, norms.k_norm) if norms is not None else (ff, ff)   # NORM only
    max_len = cache_k.shape[-2]
    seq_rows = rows.kv_heads * max_len if len(cache_k.shape) == 4 else 0
    q8 = isinstance(cache_k, Q8Cache)
    if q8:
        caches = (cache_k.quants, cache_v.quants, cache_k.scales.view(np.uint16),
                  cache_v.scales.view(np.uint16))
    else:   # the scale pointers are not read: any u16 view stands in
        stand_in = pos.view(np.uint16)
        caches = (cache_k, cache_v, stand_in, stand_in)
    args = (rows.q, rows.q_out, rows.k, rows.v, *caches, pos, ff, qn, kn, rows.q_heads,
            rows.kv_heads, rows.head_dim, spec.rot_dim, max_len, seq_rows, rows.q_row,
            rows.q_out_row, rows.kv_row, spec.pos_offset, math.log2(spec.theta),
            float(norms.eps) if norms is not None else 1e-6, pos if slots is None else slots,
            spec.mscale)
    consts = (("HAS_Q", rows.has_q), ("HAS_FF", spec.freq_factors is not None),
              ("NEOX", spec.style == "neox"), ("T", rows.k.dtype),
              ("C", np.int8 if q8 else cache_k.dtype), ("NORM", norms is not None),
              ("Q8", q8), ("SLOTS", slots is not None))
    L.launch(rope_qkv_cache, (rows.tokens, rows.q_heads + rows.kv_heads, 1),
             L.threads_for(rows.head_dim, 256), args, consts, stream)


def _check_caches(cache_k, cache_v, kv_heads: int, head_dim: int, name: str,
                  tokens: int | None = None, slotted: bool = False) -> None:
    """(kv_heads, max_len, head_dim) caches; with `tokens`, f16 / f32 caches may also be
    (tokens, kv_heads, max_len, head_dim): one sequence per token; slotted: (any, kv_heads,
    max_len, head_dim), a slot table saying which."""
    if slotted or (tokens is not None and not isinstance(cache_k, Q8Cache) and
                   cache_k.ndim == 4):
        lead = cache_k.shape[0] if slotted and cache_k.ndim == 4 else tokens
        for what, c in (("cache_k", cache_k), ("cache_v", cache_v)):
            if c.ndim != 4 or c.shape[0] != lead or c.shape[1] != kv_heads or \
                    c.shape[3] != head_dim or c.dtype not in (np.float32, np.float16) or \
                    c.dtype != cache_k.dtype or c.shape != cache_k.shape:
                raise ValueError(f"{name}: {what} must be ({'n_slots' if slotted else tokens}"
                                 f", {kv_heads}, max_len, "
                                 f"{head_dim}) float32/float16 like cache_k (a sequence per "
                                 f"token), got {c.shape} {c.dtype}")
        return
    if isinstance(cache_k, Q8Cache) or isinstance(cache_v, Q8Cache):
        check_q8_pair(cache_k, cache_v, name)
        if cache_k.shape[0] != kv_heads or cache_k.shape[2] != head_dim:
            raise ValueError(f"{name}: Q8_0 caches must be ({kv_heads}, max_len, {head_dim}), "
                             f"got {cache_k.shape}")
        return
    for what, c in (("cache_k", cache_k), ("cache_v", cache_v)):
        if c.ndim != 3 or c.shape[0] != kv_heads or c.shape[2] != head_dim or \
                c.dtype not in (np.float32, np.float16) or c.dtype != cache_k.dtype:
            raise ValueError(f"{name}: {what} must be ({kv_heads}, max_len, {head_dim}) "
                             f"float32/float16 like cache_k, got {c.shape} {c.dtype}")


def rope_reference(x, positions, theta=10000.0, style="normal", rot_dim=None,
                   freq_factors=None, pos_offset=0, mscale=1.0):
    """float64 numpy RoPE of x (tokens, heads, head_dim)."""
    x = np.asarray(x, np.float64)
    head_dim = x.shape[-1]
    rot_dim = head_dim if rot_dim is None else rot_dim
    i = np.arange(rot_dim // 2)
    inv_freq = theta ** (-2.0 * i / rot_dim)
    if freq_factors is not None:
        inv_freq = inv_freq / np.asarray(freq_factors, np.float64)[: rot_dim // 2]
    angle = (np.asarray(positions, np.float64) + pos_offset)[:, None, None] * inv_freq
    cos, sin = np.cos(angle) * mscale, np.sin(angle) * mscale
    d0, d1 = (i, i + rot_dim // 2) if style == "neox" else (2 * i, 2 * i + 1)
    y = x.copy()
    y[..., d0] = x[..., d0] * cos - x[..., d1] * sin
    y[..., d1] = x[..., d0] * sin + x[..., d1] * cos
    return y
