"""The RoPE kernels of stdlib_kernels/rotary.py (which checks the arguments and launches
them): `rope_heads` rotates (tokens, heads, head_dim) rows; `rope_qkv_cache` rotates q in
place (or into q_out) and writes rotated k and v into the KV cache (f32/f16 or Q8_0), with
qwen3's per-head RMS norms first where NORM.

Angle for pair i at position p: p * theta^(-2i/rot_dim) / freq_factor[i], computed in f32 as
llama.cpp does (rotary.py's docstring).
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64, u16

from ._device import warp_sum
from .attention.kv_q8 import MAX_HEAD_DIM as MAX_Q8_HEAD_DIM, store_q8_0_row


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
