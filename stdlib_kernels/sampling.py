"""Sampling on the device, so a decode step moves one int32 token id to the host: greedy
argmax, temperature + top-k + top-p + min-p sampling from logits with a given uniform random
number, and repetition/presence/frequency penalties; numpy references next to them.

Input: logits (vocab,) f32 ((rows, vocab) for argmax), u (a device float32 array of 1, or a
float) in [0, 1), history (n,) int32 of recent token ids (entries < 0 are empty slots, so a
fixed-size ring buffer can be replayed in a CUDA graph). Output: int32 token ids.

Semantics (llama.cpp's sampler chain order): penalties -> top-k -> top-p -> min-p ->
temperature -> draw. Argmax ties go to the lowest index; NaN logits are never chosen.
top-k keeps logits >= the k-th largest (ties at that value are all kept); top-p keeps the
largest logits whose softmax mass (over the top-k survivors, temperature 1) first reaches p;
min-p keeps p_i >= min_p * p_max; the draw picks, in index order, the first survivor whose
cumulative weight exp((x - max) / T) exceeds u * total. Thresholds are found by a 32-step
bisection over the logits' order-preserving u32 keys (no sort), in one block of 1024 threads.
"""
from __future__ import annotations

import math

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64, u32

from . import _launch as L
from ._device import NEG_INF, block_max, block_sum

SAMPLE_THREADS = 1024
BIG_INDEX = 2**31 - 1


@pk.func
def order_key(x: f32) -> u32:
    """u32 whose unsigned order is the float order (NaN excluded by callers)."""
    bits = pk.bitcast(x, u32)
    return bits ^ (u32(0xFFFFFFFF) if (bits >> 31) == u32(1) else u32(0x80000000))


@pk.func
def better(v: f32, i: i32, bv: f32, bi: i32) -> bool:
    return v > bv or (v == bv and i < bi)


@pk.func
def block_argmax(v: f32, i: i32, sv, si) -> i32:
    for k in pk.static_range(5):
        ov = pk.shfl_xor(v, 16 >> k)
        oi = pk.shfl_xor(i, 16 >> k)
        if better(ov, oi, v, i):
            v = ov
            i = oi
    lane = pk.lane_id()
    pk.syncthreads()
    if lane == 0:
        sv[pk.thread_idx.x // 32] = v
        si[pk.thread_idx.x // 32] = i
    pk.syncthreads()
    v = f32(NEG_INF)
    i = i32(2147483647)
    if lane < (pk.block_dim.x + 31) // 32:
        v = sv[lane]
        i = si[lane]
    for k in pk.static_range(5):
        ov = pk.shfl_xor(v, 16 >> k)
        oi = pk.shfl_xor(i, 16 >> k)
        if better(ov, oi, v, i):
            v = ov
            i = oi
    return i


@pk.kernel
def argmax_rows(x: Ptr[f32, "ro"], out: Ptr[i32], n: i32):
    sv = pk.shared_array(f32, 32)
    si = pk.shared_array(i32, 32)
    xr = x + i64(pk.block_idx.x) * i64(n)
    bv = f32(NEG_INF)
    bi = i32(2147483647)
    for c in range(pk.thread_idx.x, n, pk.block_dim.x):
        v = xr[c]
        if better(v, c, bv, bi):   # NaN compares false: never taken
            bv = v
            bi = c
    best = block_argmax(bv, bi, sv, si)
    if pk.thread_idx.x == 0:
        out[pk.block_idx.x] = best


@pk.kernel
def penalties_row(logits: Ptr[f32], history: Ptr[i32, "ro"], n_hist: i32, vocab: i32,
                  repeat: f32, presence: f32, frequency: f32):
    # each distinct token of the history is handled once, by the thread owning its first slot
    for i in range(pk.thread_idx.x, n_hist, pk.block_dim.x):
        tok = history[i]
        first = tok >= 0 and tok < vocab
        for j in range(0, i):
            if history[j] == tok:
                first = False
        if first:
            count = 0
            for j in range(i, n_hist):
                if history[j] == tok:
                    count += 1
            v = logits[tok]
            v = v / repeat if v > 0.0 else v * repeat
            logits[tok] = v - f32(count) * frequency - presence


@pk.func
def mass_at_least(x, n: i32, key: u32, floor: u32, m: f32, WEIGHTED: Const[bool],
                  scratch) -> f32:
    """Count (or softmax weight exp(x - m)) of logits whose key is >= key and >= floor."""
    acc = f32(0.0)
    for c in range(pk.thread_idx.x, n, pk.block_dim.x):
        v = x[c]
        k = order_key(v)
        if v == v and k >= key and k >= floor:
            if WEIGHTED:
                acc += pk.exp(v - m)
            else:
                acc += 1.0
    return block_sum(acc, scratch)


@pk.func
def select_key(x, n: i32, floor: u32, target: f32, m: f32, WEIGHTED: Const[bool],
               scratch) -> u32:
    """Largest key t with mass_at_least(t) >= target (MSB-first bisection, 32 passes)."""
    prefix = u32(0)
    for b in range(31, -1, -1):
        cand = prefix | (u32(1) << u32(b))
        if mass_at_least(x, n, cand, floor, m, WEIGHTED, scratch) >= target:
            prefix = cand
    return prefix


@pk.kernel
def sample_row(x: Ptr[f32, "ro"], u: Ptr[f32, "ro"], out: Ptr[i32], n_draws: i32, n: i32,
               top_k: i32, top_p: f32, min_p: f32, inv_temp: f32):
    scratch = pk.shared_array(f32, 32)
    sums = pk.shared_array(f32, 1024)
    tid = pk.thread_idx.x
    m = f32(NEG_INF)
    for c in range(tid, n, pk.block_dim.x):
        m = max(m, x[c])
    m = block_max(m, scratch)
    floor = u32(0)
    if top_k > 0 and top_k < n:
        floor = select_key(x, n, floor, f32(top_k), m, False, scratch)
    if top_p < 1.0:
        z = mass_at_least(x, n, floor, floor, m, True, scratch)
        floor = max(floor, select_key(x, n, floor, top_p * z, m, True, scratch))
    if min_p > 0.0:
        floor = max(floor, order_key(m + pk.log(min_p)))
    # draw: contiguous chunks per thread, block prefix over chunk weights, owner walks its chunk
    chunk = (n + pk.block_dim.x - 1) // pk.block_dim.x
    lo = min(n, tid * chunk)
    hi = min(n, lo + chunk)
    w = f32(0.0)
    for c in range(lo, hi):
        v = x[c]
        if v == v and order_key(v) >= floor:
            w += pk.exp((v - m) * inv_temp)
    sums[tid] = w
    pk.syncthreads()
    if tid == 0:   # serial exclusive scan of <= 1024 partial sums: negligible next to the passes
        run = f32(0.0)
        last = 0
        for t in range(0, pk.block_dim.x):
            s = sums[t]
            sums[t] = run
            run += s
            if s > 0.0:
                last = t
        scratch[0] = run
        scratch[1] = f32(last)
    pk.syncthreads()
    start = sums[tid]
    is_last = tid == i32(scratch[1])
    for d in range(n_draws):   # draws share the thresholds and the prefix sums
        target = u[d] * scratch[0]
        if w > 0.0 and start <= target and (target < start + w or is_last):
            acc = start
            pick = -1
            last_kept = lo
            for c in range(lo, hi):
                v = x[c]
                if v == v and order_key(v) >= floor:
                    last_kept = c
                    acc += pk.exp((v - m) * inv_temp)
                    if pick < 0 and acc > target:
                        pick = c
            out[d] = pick if pick >= 0 else last_kept   # rounding pushed target past the end


def argmax(x, *, out=None, stream=None):
    """Index of the largest value of each row (lowest index on ties, NaN never chosen):
    x (rows, n) or (n,) f32 -> int32 (rows,)."""
    x = L.as_array(x, "argmax: x", np.float32)
    rows, n = L.rows_and_length(x, "argmax: x")
    out = L.output(out, "argmax", (rows,), np.int32)
    L.launch(argmax_rows, rows, L.threads_for(n, 1024), (x, out, n), (), stream)
    return out


def apply_penalties(logits, history, *, repeat: float = 1.0, presence: float = 0.0,
                    frequency: float = 0.0, stream=None):
    """In place on logits (vocab,): for each distinct id in `history` (ids < 0 ignored) seen
    c times: logit /= repeat if > 0 else *= repeat; then logit -= c * frequency + presence."""
    logits = L.as_array(logits, "apply_penalties: logits", np.float32)
    history = L.as_array(history, "apply_penalties: history", np.int32)
    if logits.ndim != 1:
        raise ValueError(f"apply_penalties: logits must be (vocab,), got {logits.shape}")
    if history.size:
        args = (logits, history, history.size, logits.size, repeat, presence, frequency)
        L.launch(penalties_row, 1, L.threads_for(history.size, 256), args, (), stream)
    return logits


def sample(logits, u, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           min_p: float = 0.0, out=None, stream=None):
    """Draw a token id from logits (vocab,) f32 with uniform u in [0, 1) -> int32 (1,).
    u may also be an array of d uniforms: d independent draws -> int32 (d,).
    temperature <= 0 is greedy (argmax); top_k <= 0, top_p >= 1, min_p <= 0 disable a filter."""
    logits = L.as_array(logits, "sample: logits", np.float32)
    if logits.ndim != 1 or logits.size == 0:
        raise ValueError(f"sample: logits must be (vocab,), got {logits.shape}")
    u = L.as_array(np.array([u], np.float32) if np.isscalar(u) else u, "sample: u",
                   np.float32)
    out = L.output(out, "sample", (u.size,), np.int32)
    if temperature <= 0:
        return argmax(logits, out=out, stream=stream)
    args = (logits, u, out, u.size, logits.size, int(top_k), float(top_p), float(min_p),
            1.0 / temperature)
    L.launch(sample_row, 1, SAMPLE_THREADS, args, (), stream)
    return out


def penalties_reference(logits, history, repeat=1.0, presence=0.0, frequency=0.0):
    y = np.array(logits, np.float32)
    ids, counts = np.unique([t for t in np.asarray(history) if 0 <= t < y.size],
                            return_counts=True)
    for tok, count in zip(ids, counts):
        v = y[tok] / np.float32(repeat) if y[tok] > 0 else y[tok] * np.float32(repeat)
        y[tok] = v - np.float32(count * frequency) - np.float32(presence)
    return y


def filtered_probs_reference(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """float64 probabilities of each token after top-k, top-p, min-p and temperature."""
    x = np.asarray(logits, np.float64)
    keep = ~np.isnan(x)
    m = x[keep].max()
    if 0 < top_k < x.size:
        keep &= x >= np.sort(x[keep])[::-1][top_k - 1]
    if top_p < 1.0:
        w = np.where(keep, np.exp(x - m), 0.0)
        order = np.argsort(-x, kind="stable")
        cum = np.cumsum(w[order])
        cut = np.searchsorted(cum, top_p * cum[-1])   # first index where cum >= p * Z
        keep &= x >= x[order[min(cut, x.size - 1)]]
    if min_p > 0.0:
        keep &= x >= m + math.log(min_p)
    w = np.where(keep, np.exp((x - m) / temperature), 0.0)
    return w / w.sum()
