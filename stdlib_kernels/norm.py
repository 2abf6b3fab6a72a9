"""RMSNorm (optionally fused with a residual add and the weight multiply), per-head RMSNorm and
LayerNorm, with numpy references. Rows up to 32768 elements stay in registers (one read of x;
layout in _rows.py: a warp or a block per row); longer rows loop in one block per row.

Input: x (rows, n) or any shape whose last axis is normalized (f32 or f16), weight (n,) f32,
bias (n,) f32 (LayerNorm), residual like x. Output: a new array like x (or `out=`); with a
residual, `sum_out` receives x + residual (the updated residual stream).

Exact math: sums in f32 with a tree reduction, 1/sqrt correctly rounded; relative error vs a
float64 reference is below 1e-5. LayerNorm's variance is never sum/sum-of-squares: either the
row mean first, then squared deviations (two reductions), or each thread's (count, mean, squared
deviations) merged by Chan's formula in one reduction (`LAYERNORM`'s `one_pass`). Rows whose
16-byte alignment allows it use vector loads.
`out` may alias x; `sum_out` may alias x or residual (each element is read, then written, by
the same thread). RMSNorm with a weight computes (h * scale) * w, LayerNorm ((x - mean) *
rstd) * w + b.
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64

from . import _launch as L
from ._device import block_sum, load4, store4
from ._rows import (RowConfig, config_for, group_mean_m2, group_row, group_sum, load_unit,
                    one_pass, row_geometry, unit_start)

# Geometry at >= 64 rows, ((largest n, config), ...): the first entry whose n is >= the row
# length applies. From the H200 sweep at 512 rows (benchmarks/RESULTS.md, core kernels): 2
# units/thread (more threads per row) up to 2048-4096; at 8192 one-wave launch bounds (all
# 512 rows resident: 2 waves without them cost ~10%); weight loaded with x where it won.
RMSNORM = ((2048, RowConfig(chunks=2, weight_early=True)),
           (4096, RowConfig(chunks=2, bounded=True, weight_early=True)),
           (1 << 30, RowConfig(chunks=4, bounded=True)))
RMSNORM_RESIDUAL = ((2048, RowConfig(chunks=2)),     # with a residual: 4 arrays, not 2
                    (4096, RowConfig(chunks=4, weight_early=True)),
                    (1 << 30, RowConfig(chunks=8, bounded=True)))
# layernorm above 4096: one reduction of (count, mean, M2) triples (10.97 -> 10.34 us at 512 x
# 8192; the two-reduction kernel spills 12 bytes there); slower at 2048/4096 (RESULTS.md)
LAYERNORM = ((2048, RowConfig(chunks=2, weight_early=True)),
             (4096, RowConfig(chunks=4)),
             (1 << 30, RowConfig(chunks=8, bounded=True, one_pass=True)))


@pk.kernel
def rmsnorm_rows(x: Ptr["T", "ro"], residual: Ptr["T", "ro"], weight: Ptr[f32, "ro"],
                 out: Ptr["T"], sum_out: Ptr["T"], n: i32, eps: f32,
                 HAS_RES: Const[bool], HAS_W: Const[bool], VEC: Const[int], T: Const[pk.dtype]):
    scratch = pk.shared_array(f32, 32)
    base = i64(pk.block_idx.x) * i64(n)
    xr = x + base
    sr = sum_out + base
    step = pk.block_dim.x * 4
    ss = f32(0.0)
    for c in range(pk.thread_idx.x * 4, n, step):   # pass 1: sum of squares of x (+ r)
        a, b, d, e = load4(xr, c, n, VEC)
        if HAS_RES:
            ra, rb, rd, re = load4(residual + base, c, n, VEC)
            a, b, d, e = a + ra, b + rb, d + rd, e + re
            store4(sr, c, n, a, b, d, e, VEC, T)
        ss += a * a + b * b + d * d + e * e
    scale = 1.0 / pk.sqrt(block_sum(ss, scratch) / f32(n) + eps)
    for c in range(pk.thread_idx.x * 4, n, step):   # pass 2: rows are in L1/L2 by now
        if HAS_RES:
            a, b, d, e = load4(sr, c, n, VEC)
        else:
            a, b, d, e = load4(xr, c, n, VEC)
        a, b, d, e = a * scale, b * scale, d * scale, e * scale
        if HAS_W:
            wa, wb, wd, we = load4(weight, c, n, VEC)
            a, b, d, e = a * wa, b * wb, d * wd, e * we
        store4(out + base, c, n, a, b, d, e, VEC, T)


@pk.kernel
def layernorm_rows(x: Ptr["T", "ro"], weight: Ptr[f32, "ro"], bias: Ptr[f32, "ro"],
                   out: Ptr["T"], n: i32, eps: f32, HAS_W: Const[bool], HAS_B: Const[bool],
                   VEC: Const[int], T: Const[pk.dtype]):
    scratch = pk.shared_array(f32, 32)
    xr = x + i64(pk.block_idx.x) * i64(n)
    step = pk.block_dim.x * 4
    s = f32(0.0)
    for c in range(pk.thread_idx.x * 4, n, step):
        a, b, d, e = load4(xr, c, n, VEC)
        s += (a + b) + (d + e)
    mean = block_sum(s, scratch) / f32(n)
    sq = f32(0.0)
    for c in range(pk.thread_idx.x * 4, n, step):   # two-pass variance: no cancellation
        a, b, d, e = load4(xr, c, n, VEC)
        a, b, d, e = a - mean, b - mean, d - mean, e - mean
        live = n - c   # padding lanes of a partial chunk loaded 0: they must add nothing
        sq += a * a + (b * b if live > 1 else 0.0) + (d * d if live > 2 else 0.0) + \
            (e * e if live > 3 else 0.0)
    rstd = 1.0 / pk.sqrt(block_sum(sq, scratch) / f32(n) + eps)
    for c in range(pk.thread_idx.x * 4, n, step):
        a, b, d, e = load4(xr, c, n, VEC)
        a, b, d, e = (a - mean) * rstd, (b - mean) * rstd, (d - mean) * rstd, (e - mean) * rstd
        if HAS_W:
            wa, wb, wd, we = load4(weight, c, n, VEC)
            a, b, d, e = a * wa, b * wb, d * wd, e * we
        if HAS_B:
            ba, bb, bd, be = load4(bias, c, n, VEC)
            a, b, d, e = a + ba, b + bb, d + bd, e + be
        store4(out + i64(pk.block_idx.x) * i64(n), c, n, a, b, d, e, VEC, T)


@pk.func
def load_params(p, dst, c: i32, j: i32, n: i32, VEC: Const[int]):
    """Weight or bias unit j (elements c..c+3) into dst[4j..4j+3]."""
    dst[4 * j], dst[4 * j + 1], dst[4 * j + 2], dst[4 * j + 3] = load_unit(p, c, n, VEC)


@pk.kernel
def rmsnorm_regs(x: Ptr["T", "ro"], residual: Ptr["T", "ro"], weight: Ptr[f32, "ro"],
                 out: Ptr["T"], sum_out: Ptr["T"], rows: i32, n: i32, eps: f32,
                 HAS_RES: Const[bool], HAS_W: Const[bool], W_EARLY: Const[bool],
                 VEC: Const[int], CHUNKS: Const[int], GROUP: Const[int], RPB: Const[int],
                 TRIGGER: Const[bool], T: Const[pk.dtype]):
    if TRIGGER:   # the grid is one resident wave: let a PDL successor launch now
        pk.launch_dependents()
    scratch = pk.shared_array(f32, 32)
    h = pk.local_array(f32, 4 * CHUNKS)   # this thread's units of the row (registers)
    w = pk.local_array(f32, 4 * CHUNKS)   # W_EARLY: the weight's units, loaded with x's
    row, lane, live = group_row(rows, GROUP, RPB)
    base = i64(row) * i64(n)
    for j in pk.static_range(CHUNKS):   # every load before any store (out may alias x)
        c = unit_start(j, lane, GROUP)
        a, b, d, e = load_unit(x + base, c, n, VEC)
        if HAS_RES:
            ra, rb, rd, re = load_unit(residual + base, c, n, VEC)
            a, b, d, e = a + ra, b + rb, d + rd, e + re
        h[4 * j], h[4 * j + 1], h[4 * j + 2], h[4 * j + 3] = a, b, d, e
        if HAS_W and W_EARLY:
            load_params(weight, w, c, j, n, VEC)
    ss = f32(0.0)
    for j in pk.static_range(4 * CHUNKS):   # padding past n was loaded as 0: adds nothing
        ss += h[j] * h[j]
    if HAS_RES:
        for j in pk.static_range(CHUNKS):
            c = unit_start(j, lane, GROUP)
            if live and c < n:
                store4(sum_out + base, c, n, h[4 * j], h[4 * j + 1], h[4 * j + 2],
                       h[4 * j + 3], VEC, T)
    scale = 1.0 / pk.sqrt(group_sum(ss, scratch, GROUP) / f32(n) + eps)
    # without W_EARLY the weight (L2-resident, shared by all rows) is read after the
    # reduction, so only x's registers are live while x's loads are in flight
    for j in pk.static_range(CHUNKS):
        c = unit_start(j, lane, GROUP)
        if HAS_W and not W_EARLY:
            load_params(weight, w, c, j, n, VEC)
        a, b, d, e = h[4 * j] * scale, h[4 * j + 1] * scale, h[4 * j + 2] * scale, \
            h[4 * j + 3] * scale
        if HAS_W:
            a, b, d, e = a * w[4 * j], b * w[4 * j + 1], d * w[4 * j + 2], e * w[4 * j + 3]
        if live and c < n:
            store4(out + base, c, n, a, b, d, e, VEC, T)


@pk.func
def row_mean_m2(v, s: f32, lane: i32, n: i32, scratch, CHUNKS: Const[int], GROUP: Const[int]):
    """(mean, sum of squared deviations) of the row whose units this thread holds in v (0 past
    n; s = their sum): the thread's own count, mean and squared deviations, then one
    reduction of those triples (Chan's merge; one barrier)."""
    count = f32(0.0)
    for j in pk.static_range(CHUNKS):
        count += f32(min(max(n - unit_start(j, lane, GROUP), 0), 4))
    mean = s / count if count > 0.0 else f32(0.0)
    q = f32(0.0)
    for j in pk.static_range(CHUNKS):
        c = unit_start(j, lane, GROUP)
        for k in pk.static_range(4):
            dev = v[4 * j + k] - mean if c + k < n else f32(0.0)   # padding adds nothing
            q += dev * dev
    return group_mean_m2(count, mean, q, scratch, GROUP)


@pk.func
def row_m2_two_pass(v, s: f32, lane: i32, n: i32, scratch, scratch2, CHUNKS: Const[int],
                    GROUP: Const[int]) -> f32:
    """The row's sum of squared deviations with the row sum reduced first, then the squared
    deviations (two reductions, two barriers). Leaves x - mean in v (fewer live registers
    than keeping x and the mean: 8 units spilled more without it)."""
    mean = group_sum(s, scratch, GROUP) / f32(n)
    q = f32(0.0)
    for j in pk.static_range(CHUNKS):   # two-pass variance from registers: no cancellation
        c = unit_start(j, lane, GROUP)
        for k in pk.static_range(4):
            dev = v[4 * j + k] - mean if c + k < n else f32(0.0)
            v[4 * j + k] = dev
            q += dev * dev
    return group_sum(q, scratch2, GROUP)


@pk.kernel
def layernorm_regs(x: Ptr["T", "ro"], weight: Ptr[f32, "ro"], bias: Ptr[f32, "ro"],
                   out: Ptr["T"], rows: i32, n: i32, eps: f32, HAS_W: Const[bool],
                   HAS_B: Const[bool], ONE_PASS: Const[bool], W_EARLY: Const[bool],
                   VEC: Const[int], CHUNKS: Const[int], GROUP: Const[int], RPB: Const[int],
                   TRIGGER: Const[bool], T: Const[pk.dtype]):
    if TRIGGER:   # the grid is one resident wave: let a PDL successor launch now
        pk.launch_dependents()
    scratch = pk.shared_array(f32, 96)
    scratch2 = pk.shared_array(f32, 32)
    v = pk.local_array(f32, 4 * CHUNKS)
    w = pk.local_array(f32, 4 * CHUNKS)
    bb = pk.local_array(f32, 4 * CHUNKS)
    row, lane, live = group_row(rows, GROUP, RPB)
    base = i64(row) * i64(n)
    s = f32(0.0)
    for j in pk.static_range(CHUNKS):   # all loads first: one memory latency, not CHUNKS
        c = unit_start(j, lane, GROUP)
        a, b, d, e = load_unit(x + base, c, n, VEC)   # 0 past n
        v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3] = a, b, d, e
        s += (a + b) + (d + e)
        if W_EARLY:
            if HAS_W:
                load_params(weight, w, c, j, n, VEC)
            if HAS_B:
                load_params(bias, bb, c, j, n, VEC)
    if ONE_PASS:
        mean, q = row_mean_m2(v, s, lane, n, scratch, CHUNKS, GROUP)
    else:   # v holds x - mean already
        q = row_m2_two_pass(v, s, lane, n, scratch, scratch2, CHUNKS, GROUP)
        mean = f32(0.0)
    rstd = 1.0 / pk.sqrt(q / f32(n) + eps)
    for j in pk.static_range(CHUNKS):
        c = unit_start(j, lane, GROUP)
        if not W_EARLY:
            if HAS_W:
                load_params(weight, w, c, j, n, VEC)
            if HAS_B:
                load_params(bias, bb, c, j, n, VEC)
        a, b, d, e = (v[4 * j] - mean) * rstd, (v[4 * j + 1] - mean) * rstd, \
            (v[4 * j + 2] - mean) * rstd, (v[4 * j + 3] - mean) * rstd
        if HAS_W:
            a, b, d, e = a * w[4 * j], b * w[4 * j + 1], d * w[4 * j + 2], e * w[4 * j + 3]
        if HAS_B:
            a, b, d, e = a + bb[4 * j], b + bb[4 * j + 1], d + bb[4 * j + 2], e + bb[4 * j + 3]
        if live and c < n:
            store4(out + base, c, n, a, b, d, e, VEC, T)


def _spec(vec, dtype, **flags) -> tuple:
    return tuple(sorted(flags.items())) + (("VEC", vec), ("T", np.dtype(dtype)))


def _launch_rows(regs_kernel, loop_kernel, rows, n, args, spec, stream, table):
    """Row in registers when it fits (args gain `rows` before n), else one block loops."""
    config = config_for(table, n)
    geo = row_geometry(rows, n, config)
    if geo is None:
        L.launch(loop_kernel, rows, L.threads_for(-(-n // 4)), args, spec, stream)
        return
    regs_args = args[:-2] + (rows,) + args[-2:]
    regs_spec = spec + (("W_EARLY", config.weight_early),) + geo.spec()
    if regs_kernel is layernorm_regs:
        regs_spec += (("ONE_PASS", one_pass(config, rows)),)
    L.launch(regs_kernel, geo.grid, geo.block, regs_args, regs_spec, stream,
             bounds=geo.bounds)


def rmsnorm(x, weight=None, eps: float = 1e-6, *, residual=None, out=None, sum_out=None,
            stream=None):
    """RMSNorm over the last axis: x / sqrt(mean(x^2) + eps) * weight.

    With `residual`, normalizes h = x + residual and writes h to `sum_out` (new array if None;
    returns (out, sum_out)). Per-head norm: pass x shaped (..., heads, head_dim) and a
    (head_dim,) weight: every head is one row."""
    x = L.as_array(x, "rmsnorm: x")
    if x.dtype not in (np.float32, np.float16):
        raise TypeError(f"rmsnorm: x must be float32 or float16, got {x.dtype}")
    rows, n = L.rows_and_length(x, "rmsnorm: x")
    w = None if weight is None else L.as_array(weight, "rmsnorm: weight", np.float32)
    if w is not None and w.size != n:
        raise ValueError(f"rmsnorm: weight has {w.size} elements, rows have {n}")
    r = None if residual is None else L.as_array(residual, "rmsnorm: residual", x.dtype)
    if r is not None and r.shape != x.shape:
        raise ValueError(f"rmsnorm: residual shape {r.shape} != x shape {x.shape}")
    out = L.output(out, "rmsnorm", x.shape, x.dtype)
    s = None if r is None else L.output(sum_out, "rmsnorm sum_out", x.shape, x.dtype)
    vec = L.vector_width(n, x, w, r, out, s)
    args = (x, L.either(r, x), L.either(w, L.dummy(np.float32)), out, L.either(s, out), n, eps)
    spec = _spec(vec, x.dtype, HAS_RES=r is not None, HAS_W=w is not None)
    _launch_rows(rmsnorm_regs, rmsnorm_rows, rows, n, args, spec, stream,
                 RMSNORM if r is None else RMSNORM_RESIDUAL)
    return out if r is None else (out, s)


def layernorm(x, weight=None, bias=None, eps: float = 1e-5, *, out=None, stream=None):
    """LayerNorm over the last axis: (x - mean) / sqrt(var + eps) * weight + bias."""
    x = L.as_array(x, "layernorm: x")
    if x.dtype not in (np.float32, np.float16):
        raise TypeError(f"layernorm: x must be float32 or float16, got {x.dtype}")
    rows, n = L.rows_and_length(x, "layernorm: x")
    w = None if weight is None else L.as_array(weight, "layernorm: weight", np.float32)
    b = None if bias is None else L.as_array(bias, "layernorm: bias", np.float32)
    for name, p in (("weight", w), ("bias", b)):
        if p is not None and p.size != n:
            raise ValueError(f"layernorm: {name} has {p.size} elements, rows have {n}")
    out = L.output(out, "layernorm", x.shape, x.dtype)
    vec = L.vector_width(n, x, w, b, out)
    none = L.dummy(np.float32)
    args = (x, L.either(w, none), L.either(b, none), out, n, eps)
    spec = _spec(vec, x.dtype, HAS_W=w is not None, HAS_B=b is not None)
    _launch_rows(layernorm_regs, layernorm_rows, rows, n, args, spec, stream,
                 LAYERNORM)
    return out


def rmsnorm_reference(x, weight=None, eps=1e-6, residual=None):
    """float64 numpy RMSNorm (and the residual sum when `residual` is given)."""
    h = np.asarray(x, np.float64) + (0 if residual is None else np.asarray(residual, np.float64))
    y = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + eps)
    y = y if weight is None else y * np.asarray(weight, np.float64)
    return y if residual is None else (y, h)


def layernorm_reference(x, weight=None, bias=None, eps=1e-5):
    x = np.asarray(x, np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    y = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    y = y if weight is None else y * np.asarray(weight, np.float64)
    return y if bias is None else y + np.asarray(bias, np.float64)
