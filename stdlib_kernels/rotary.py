"""Rotary position embeddings (RoPE), normal (adjacent pairs, llama) and NEOX (pairs i and
i + rot_dim/2; qwen2/qwen3/gemma3), and the fused "RoPE q, RoPE k and write k, v into the KV
cache" kernel used by the decode step, with numpy references.

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
from pykernel import Const, Ptr, f32, i32, i64, u16

from . import _launch as L
from ._device import warp_sum
from .attention.kv_q8 import (MAX_HEAD_DIM as MAX_Q8_HEAD_DIM, Q8Cache,
                              check_pair as check_q8_pair, store_q8_0_row)


@pk.func
def rope_angle(pos: i32, i: i32, rot_dim: i32, log2_base: f32, ff, HAS_FF: Const[bool]) -> f32:
    inv_freq = pk.exp2(f32(-2 * i) / f32(rot_dim) * log2_base)
    theta = f32(pos) * inv_freq
    if HAS_FF:
        theta = theta / ff[i]
    return theta


@pk.func
def pair_dims(i: i32, rot_dim: i32, NEOX: Const[bool]):
    if NEOX:
        return i, i + rot_dim // 2
    else:
        return 2 * i, 2 * i + 1


@pk.func
def rope_head(src, dst, pos: i32, head_dim: i32, rot_dim: i32, log2_base: f32, ff,
              HAS_FF: Const[bool], NEOX: Const[bool], T: Const[pk.dtype], rstd: f32, nw,
              NORM: Const[bool], mscale: f32):
    """Rotate one head (src -> dst, may alias); dims >= rot_dim are copied. NORM: the head is
    first RMS-normalized, x * rstd * nw[d] (qwen3 / gemma3's q_norm / k_norm; rstd from
    head_rstd). mscale multiplies cos and sin (YaRN's magnitude scale; 1 otherwise)."""
    for i in range(pk.thread_idx.x, rot_dim // 2, pk.block_dim.x):
        d0, d1 = pair_dims(i, rot_dim, NEOX)
        theta = rope_angle(pos, i, rot_dim, log2_base, ff, HAS_FF)
        c = pk.cos(theta) * mscale
        s = pk.sin(theta) * mscale
        x0 = f32(src[d0])
        x1 = f32(src[d1])
        if NORM:
            x0 = x0 * rstd * nw[d0]
            x1 = x1 * rstd * nw[d1]
        dst[d0] = T(x0 * c - x1 * s)
        dst[d1] = T(x0 * s + x1 * c)
    for d in range(rot_dim + pk.thread_idx.x, head_dim, pk.block_dim.x):
        x = f32(src[d])
        if NORM:
            x = x * rstd * nw[d]
        dst[d] = T(x)


@pk.func
def head_rstd(src, head_dim: i32, eps: f32, scratch) -> f32:
    """Whole block (at most 8 warps): 1 / sqrt(mean(src[0:head_dim]^2) + eps) of one head, as
    ggml's rms_norm (f32 sums; the order: per thread, then warps, then across warps)."""
    ss = f32(0.0)
    for d in range(pk.thread_idx.x, head_dim, pk.block_dim.x):
        x = f32(src[d])
        ss += x * x
    ss = warp_sum(ss)
    lane = pk.lane_id()
    if lane == 0:
        scratch[pk.thread_idx.x // 32] = ss
    pk.syncthreads()
    total = f32(0.0)
    if lane < (pk.block_dim.x + 31) // 32:
        total = scratch[lane]
    total = warp_sum(total)
    return 1.0 / pk.sqrt(total / f32(head_dim) + eps)


@pk.kernel
def rope_heads(x: Ptr["T", "ro"], out: Ptr["T"], positions: Ptr[i32, "ro"], ff: Ptr[f32, "ro"],
               heads: i32, head_dim: i32, rot_dim: i32, pos_offset: i32, log2_base: f32,
               mscale: f32, HAS_FF: Const[bool], NEOX: Const[bool], T: Const[pk.dtype]):
    # grid (tokens, heads): one block per head of one token
    t = pk.block_idx.x
    base = (i64(t) * i64(heads) + i64(pk.block_idx.y)) * i64(head_dim)
    pos = positions[t] + pos_offset
    rope_head(x + base, out + base, pos, head_dim, rot_dim, log2_base, ff, HAS_FF, NEOX, T,
              f32(1.0), ff, False, mscale)


@pk.kernel
def rope_qkv_cache(q: Ptr["T"], q_out: Ptr["T"], k: Ptr["T", "ro"], v: Ptr["T", "ro"],
                   cache_k: Ptr["C"], cache_v: Ptr["C"], k_scales: Ptr[u16], v_scales: Ptr[u16],
                   positions: Ptr[i32, "ro"], ff: Ptr[f32, "ro"],
                   qn: Ptr[f32, "ro"], kn: Ptr[f32, "ro"],
                   q_heads: i32, kv_heads: i32, head_dim: i32, rot_dim: i32, max_len: i32,
                   seq_rows: i32, q_row: i32, q_out_row: i32, kv_row: i32, pos_offset: i32,
                   log2_base: f32, eps: f32, slots: Ptr[i32, "ro"], mscale: f32,
                   HAS_Q: Const[bool], HAS_FF: Const[bool], NEOX: Const[bool],
                   T: Const[pk.dtype], C: Const[pk.dtype], NORM: Const[bool],
                   Q8: Const[bool], SLOTS: Const[bool]):
    # grid (tokens, q_heads + kv_heads): blocks y < q_heads rotate q into q_out (q itself, or
    # a separate buffer), the others rotate one k head into the cache and copy the matching v
    # head; token t's q heads start at q + t q_row (q_out + t q_out_row), its k / v heads at
    # k / v + t kv_row, its cache rows at t seq_rows (0: every token in one sequence's cache;
    # kv_heads max_len: token t in sequence t's, batched decode; with SLOTS, in sequence
    # slots[t]'s: several prompts' tokens in one pass). NORM: q and k heads are first
    # RMS-normalized with weights qn / kn (head_dim each). Q8: a Q8_0 cache (C = i8 quants,
    # f16 scales in k_scales / v_scales): the rotated k and the v head are staged in shared
    # memory as f32 and quantized from there (kv_q8.store_q8_0_row)
    pk.launch_dependents()   # decode: one short wave, let the next kernel launch now
    scratch = pk.shared_array(f32, 8)
    stage = pk.shared_array(f32, MAX_Q8_HEAD_DIM if Q8 else 1)
    t = pk.block_idx.x
    h = pk.block_idx.y
    pos = positions[t] + pos_offset
    if h < q_heads:
        if HAS_Q:
            qb = q + i64(t) * i64(q_row) + i64(h) * i64(head_dim)
            qd = q_out + i64(t) * i64(q_out_row) + i64(h) * i64(head_dim)
            rstd = f32(1.0)
            if NORM:
                rstd = head_rstd(qb, head_dim, eps, scratch)
            rope_head(qb, qd, pos, head_dim, rot_dim, log2_base, ff, HAS_FF, NEOX, T, rstd,
                      qn, NORM, mscale)
    elif pos >= 0 and pos < max_len:
        kvh = h - q_heads
        src = i64(t) * i64(kv_row) + i64(kvh) * i64(head_dim)
        seq = slots[t] if SLOTS else t
        row = i64(seq) * i64(seq_rows) + i64(kvh) * i64(max_len) + i64(pos)
        dst = row * i64(head_dim)
        rstd = f32(1.0)
        if NORM:
            rstd = head_rstd(k + src, head_dim, eps, scratch)
        if Q8:
            rope_head(k + src, stage, pos, head_dim, rot_dim, log2_base, ff, HAS_FF, NEOX, f32,
                      rstd, kn, NORM, mscale)
            pk.syncthreads()
            store_q8_0_row(stage, cache_k, k_scales, row, head_dim)
            pk.syncthreads()
            for d in range(pk.thread_idx.x, head_dim, pk.block_dim.x):
                stage[d] = f32(v[src + i64(d)])
            pk.syncthreads()
            store_q8_0_row(stage, cache_v, v_scales, row, head_dim)
        else:
            rope_head(k + src, cache_k + dst, pos, head_dim, rot_dim, log2_base, ff, HAS_FF,
                      NEOX, C, rstd, kn, NORM, mscale)
            for d in range(pk.thread_idx.x, head_dim, pk.block_dim.x):
                cache_v[dst + i64(d)] = C(f32(v[src + i64(d)]))


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
