"""Row softmax: stable (max-subtracted), any row length, optional scale, causal mask and
soft-capping, with a numpy reference.

Input: x (rows, n) f32 (any shape; the last axis is the row). Output: (rows, n) f32 (or `out=`,
which may alias x). Each logit becomes z = x * scale, then cap * tanh(z / cap) when softcap > 0.
Causal mask: row r is query q = r % q_len at absolute position q + pos_offset; column c is kept
when c <= q + pos_offset (defaults: q_len = rows, pos_offset = n - q_len, i.e. queries are the
last q_len of n keys). A fully masked row is written as zeros.
Exact math (accurate exp/tanh): relative error below 1e-5 vs float64.
Rows up to 32768 elements stay in registers (_rows.py layout): one read, max, one exp per
element (branch-free, for arguments <= 0; below e**-87 ~ 1.6e-38 it flushes to 0), sum, scaled
store. `RowConfig.one_pass` instead reduces each thread's (max, sum of exp(x - its max)) pairs
at once (one barrier); measured slower (the exp in every merge step), so no default uses it.
Longer rows: one block loops twice, keeping a per-thread running (max, sum of exp) pair in the
first pass.
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64

from . import _launch as L
from ._device import NEG_INF, block_max, block_sum, exp_nonpositive, store4
from ._rows import (RowConfig, config_for, group_max, group_max_sum, group_row, group_sum,
                    load_unit, one_pass, row_geometry, unit_start)

# Geometry at >= 64 rows, ((largest n, config), ...) as in norm.py: the H200 sweep's fastest
# at 512 rows (benchmarks/RESULTS.md); launch bounds, one pass and the entry trigger measured
# slower for softmax
SOFTMAX = ((4096, RowConfig(chunks=2)), (1 << 30, RowConfig(chunks=4)))


@pk.func
def logit(v: f32, c: i32, limit: i32, scale: f32, softcap: f32, CAUSAL: Const[bool],
          SOFTCAP: Const[bool]) -> f32:
    z = v * scale
    if SOFTCAP:
        z = softcap * pk.tanh(z / softcap)
    if CAUSAL:
        if c > limit:
            z = f32(NEG_INF)
    return z


@pk.kernel
def softmax_rows(x: Ptr[f32, "ro"], out: Ptr[f32], n: i32, scale: f32, softcap: f32,
                 q_len: i32, pos_offset: i32, CAUSAL: Const[bool], SOFTCAP: Const[bool]):
    scratch = pk.shared_array(f32, 32)
    row = pk.block_idx.x
    xr = x + i64(row) * i64(n)
    orow = out + i64(row) * i64(n)
    limit = row % q_len + pos_offset
    m = f32(NEG_INF)
    s = f32(0.0)
    for c in range(pk.thread_idx.x, n, pk.block_dim.x):   # online max and rescaled sum
        z = logit(xr[c], c, limit, scale, softcap, CAUSAL, SOFTCAP)
        if z > m:
            s = s * pk.exp(m - z) + 1.0
            m = z
        elif z > f32(NEG_INF):
            s += pk.exp(z - m)
    row_max = block_max(m, scratch)
    if m > f32(NEG_INF):
        s = s * pk.exp(m - row_max)
    total = block_sum(s, scratch)
    inv = 0.0 if total == 0.0 else 1.0 / total
    for c in range(pk.thread_idx.x, n, pk.block_dim.x):
        z = logit(xr[c], c, limit, scale, softcap, CAUSAL, SOFTCAP)
        p = f32(0.0)
        if z > f32(NEG_INF):
            p = pk.exp(z - row_max) * inv
        orow[c] = p


@pk.func
def one_pass_scale(z, m: f32, scratch, CHUNKS: Const[int], GROUP: Const[int]) -> f32:
    """z: this thread's logits, m their max. Replaces z by exp(z - m) and returns the factor
    exp(m - row max) / row sum that turns them into probabilities: one reduction of (max,
    sum) pairs instead of a max and then a sum (one barrier instead of two)."""
    s = f32(0.0)
    for j in pk.static_range(4 * CHUNKS):
        p = exp_nonpositive(z[j] - m)   # an all -inf thread: NaN -> 0
        z[j] = p
        s += p
    row_max, total = group_max_sum(m, s, scratch, GROUP)
    return 0.0 if total == 0.0 else exp_nonpositive(m - row_max) / total


@pk.func
def two_pass_scale(z, m: f32, scratch, scratch2, CHUNKS: Const[int],
                   GROUP: Const[int]) -> f32:
    """As one_pass_scale with the row max reduced first, then the sum of exp(z - row max)."""
    row_max = group_max(m, scratch, GROUP)
    s = f32(0.0)
    for j in pk.static_range(4 * CHUNKS):   # one exp per element, kept for the store
        p = exp_nonpositive(z[j] - row_max)   # a fully masked row: -inf - -inf = NaN -> 0
        z[j] = p
        s += p
    total = group_sum(s, scratch2, GROUP)
    return 0.0 if total == 0.0 else 1.0 / total


@pk.kernel
def softmax_regs(x: Ptr[f32, "ro"], out: Ptr[f32], rows: i32, n: i32, scale: f32,
                 softcap: f32, q_len: i32, pos_offset: i32, CAUSAL: Const[bool],
                 SOFTCAP: Const[bool], ONE_PASS: Const[bool], VEC: Const[int],
                 CHUNKS: Const[int], GROUP: Const[int], RPB: Const[int],
                 TRIGGER: Const[bool]):
    if TRIGGER:   # the grid is one resident wave: let a PDL successor launch now
        pk.launch_dependents()
    scratch = pk.shared_array(f32, 64)
    scratch2 = pk.shared_array(f32, 32)
    z = pk.local_array(f32, 4 * CHUNKS)   # logits, then exps, of this thread's units
    row, lane, live = group_row(rows, GROUP, RPB)
    base = i64(row) * i64(n)
    limit = row % q_len + pos_offset
    for j in pk.static_range(CHUNKS):   # all loads first: one memory latency, not CHUNKS
        a, b, d, e = load_unit(x + base, unit_start(j, lane, GROUP), n, VEC)
        z[4 * j] = a
        z[4 * j + 1] = b
        z[4 * j + 2] = d
        z[4 * j + 3] = e
    m = f32(NEG_INF)
    for j in pk.static_range(4 * CHUNKS):
        c = unit_start(j // 4, lane, GROUP) + j % 4
        v = logit(z[j], c, limit, scale, softcap, CAUSAL, SOFTCAP)
        v = v if c < n else f32(NEG_INF)   # padding of a partial unit takes no part
        z[j] = v
        m = max(m, v)
    if ONE_PASS:
        inv = one_pass_scale(z, m, scratch, CHUNKS, GROUP)
    else:
        inv = two_pass_scale(z, m, scratch, scratch2, CHUNKS, GROUP)
    for j in pk.static_range(CHUNKS):
        c = unit_start(j, lane, GROUP)
        if live and c < n:
            store4(out + base, c, n, z[4 * j] * inv, z[4 * j + 1] * inv, z[4 * j + 2] * inv,
                   z[4 * j + 3] * inv, VEC, f32)


def softmax(x, scale: float = 1.0, *, causal: bool = False, q_len=None, pos_offset=None,
            softcap: float = 0.0, out=None, stream=None):
    """Softmax over the last axis of scale * x (see the module docstring for mask/softcap)."""
    x = L.as_array(x, "softmax: x", np.float32)
    rows, n = L.rows_and_length(x, "softmax: x")
    q_len = rows if q_len is None else int(q_len)
    if q_len < 1:
        raise ValueError(f"softmax: q_len must be >= 1, got {q_len}")
    pos_offset = n - q_len if pos_offset is None else int(pos_offset)
    out = L.output(out, "softmax", x.shape, np.float32)
    args = (x, out, n, scale, softcap if softcap > 0 else 1.0, q_len, pos_offset)
    spec = (("CAUSAL", bool(causal)), ("SOFTCAP", softcap > 0))
    config = config_for(SOFTMAX, n)
    geo = row_geometry(rows, n, config)
    if geo is None:   # too long for registers: one block loops over the row twice
        L.launch(softmax_rows, rows, L.threads_for(n, 1024), args, spec, stream)
        return out
    spec += (("ONE_PASS", one_pass(config, rows)), ("VEC", L.vector_width(n, x, out))) + \
        geo.spec()
    L.launch(softmax_regs, geo.grid, geo.block, args[:2] + (rows,) + args[2:], spec, stream,
             bounds=geo.bounds)
    return out


def softmax_reference(x, scale=1.0, causal=False, q_len=None, pos_offset=None, softcap=0.0):
    """float64 numpy version of `softmax` (fully masked rows -> zeros)."""
    x = np.asarray(x, np.float64)
    shape = x.shape
    z = x.reshape(-1, shape[-1]) * scale
    rows, n = z.shape
    if softcap > 0:
        z = softcap * np.tanh(z / softcap)
    if causal:
        q_len = rows if q_len is None else q_len
        pos_offset = n - q_len if pos_offset is None else pos_offset
        limit = np.arange(rows) % q_len + pos_offset
        z = np.where(np.arange(n)[None, :] > limit[:, None], -np.inf, z)
    m = z.max(axis=1, keepdims=True)
    e = np.where(np.isfinite(z), np.exp(z - np.where(np.isfinite(m), m, 0)), 0.0)
    total = e.sum(axis=1, keepdims=True)
    return (e / np.where(total > 0, total, 1)).reshape(shape)
