"""Multi-block sampling kernels (the wrappers are in sampling.py).

Blocks of PASS_THREADS threads each read a span of 4 * UNITS * PASS_THREADS logits once; the
block that finishes last (atomic ticket, see _select.last_block_done) merges the per-block
results, so one launch covers a whole vocabulary:
- argmax_blocks: per-block (value, index), merged by the last block (per row: grid.y = rows).
- sample_temp (temperature only): per-block max m_b and weights exp((x - m_b) / T), an
  inclusive prefix over the block's 4-element units (global `unit_cum`, block-local scale);
  the last block rescales the block sums to the global max, prefix-sums them, and each draw
  binary-searches block -> unit -> element (first cumulative weight > u * total); a row
  whose largest logit is not finite (all NaN, only -Inf, or +Inf) draws -1.
- sample_hist + sample_pick (any of top-k/top-p/min-p): pass 1 builds a 4096-bin histogram of
  the top 12 bits of the order keys and the global max M; its last block picks a bin B: the
  bin of the k-th largest logit (top-k on), else of min-p's threshold (min-p on), else the
  lowest bin with at most CANDIDATES logits at or above it, and never below that lowest bin.
  Pass 2 compacts the logits in bins >= B into a
  candidate list; its last block (SAMPLE_THREADS threads) finds the thresholds by radix select
  on the candidates, sorts the survivors by index and draws. When the survivors might lie
  outside the candidates (ties or flat logits at the top-k cut, top-p alone reaching deep into
  the vocabulary), that block runs the exact single-block algorithm (draw_full) instead.
Scratch buffers (workspace in sampling.py) are reset by the kernels that use them, so the
launches replay in a CUDA graph.
"""
import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64

from . import collectives as C
from ._device import NEG_INF, block_max, finite, load4
from ._select import BIG_INDEX, better, block_argmax, block_scan, last_block_done, search_cum

PASS_THREADS = 256
SAMPLE_THREADS = 1024
CANDIDATES = 2048
HIST_BINS = 4096       # order key >> 20
MAX_BLOCKS = 1024


@pk.func
def span_values(xr, n: i32, vals, fill: f32, UNITS: Const[int], VEC: Const[int]):
    """This block's span of 4 * UNITS * block_dim elements into the thread's local vals
    (its UNITS units of 4, unit j at j * block_dim + thread); units past n read as fill."""
    span = pk.block_idx.x * (4 * UNITS * pk.block_dim.x)
    for j in pk.static_range(UNITS):
        c = span + (j * pk.block_dim.x + pk.thread_idx.x) * 4
        a, b, d, e = fill, fill, fill, fill
        if c < n:
            a, b, d, e = unit_values(xr, c, n, VEC)
        vals[4 * j] = a
        vals[4 * j + 1] = b
        vals[4 * j + 2] = d
        vals[4 * j + 3] = e


@pk.func
def count_before_bins(hist, scan_tmp):
    """(top_bin, count): thread t owns the HIST_BINS / PASS_THREADS bins from top_bin =
    4095 - 16t down; count is how many of hist's entries lie in the bins above them (an
    exclusive block scan of the threads' sums, counted from the top; exact: integers in f32).
    scan_tmp: shared f32[32]."""
    per = HIST_BINS // PASS_THREADS
    top_bin = HIST_BINS - 1 - per * pk.thread_idx.x
    own = f32(0.0)
    for k in pk.static_range(per):
        own += f32(hist[top_bin - k])
    before, _total = C.block_scan(own, scan_tmp, False, PASS_THREADS)
    return top_bin, before


@pk.func
def unit_values(xr, c: i32, n: i32, VEC: Const[int]):
    """Elements c..c+3 as f32; those past n read as NaN (never chosen, no weight)."""
    a, b, d, e = load4(xr, c, n, VEC)
    nan = f32(0.0) / f32(0.0)
    return (a if c < n else nan, b if c + 1 < n else nan, d if c + 2 < n else nan,
            e if c + 3 < n else nan)


@pk.func
def span_argmax(xr, n: i32, sv, si, UNITS: Const[int], VEC: Const[int]):
    """(value, index) of the best logit in this block's span of 4 * UNITS * block_dim, on
    every thread (the block synchronises)."""
    span = pk.block_idx.x * (4 * UNITS * pk.block_dim.x)
    bv = f32(NEG_INF)
    bi = i32(BIG_INDEX)
    for j in pk.static_range(UNITS):
        c = span + (j * pk.block_dim.x + pk.thread_idx.x) * 4
        if c < n:
            a, b, d, e = unit_values(xr, c, n, VEC)
            if better(a, c, bv, bi):   # NaN compares false: never taken
                bv, bi = a, c
            if better(b, c + 1, bv, bi):
                bv, bi = b, c + 1
            if better(d, c + 2, bv, bi):
                bv, bi = d, c + 2
            if better(e, c + 3, bv, bi):
                bv, bi = e, c + 3
    return block_argmax(bv, bi, sv, si)


@pk.func
def parts_argmax(part_v, part_i, first: i32, count: i32, sv, si):
    """(value, index) of the best of `count` per-block results from `first`, on every thread."""
    bv = f32(NEG_INF)
    bi = i32(BIG_INDEX)
    for k in range(pk.thread_idx.x, count, pk.block_dim.x):
        v = part_v[first + k]
        i = part_i[first + k]
        if better(v, i, bv, bi):
            bv, bi = v, i
    return block_argmax(bv, bi, sv, si)


@pk.kernel
def argmax_blocks(x: Ptr[f32, "ro"], out: Ptr[i32], part_v: Ptr[f32], part_i: Ptr[i32],
                  counter: Ptr[i32], n: i32, VEC: Const[int], UNITS: Const[int]):
    sv = pk.shared_array(f32, 32)
    si = pk.shared_array(i32, 32)
    flag = pk.shared_array(i32, 1)
    row = pk.block_idx.y
    blocks = pk.grid_dim.x
    bv, bi = span_argmax(x + i64(row) * i64(n), n, sv, si, UNITS, VEC)
    slot = row * blocks + pk.block_idx.x
    if pk.thread_idx.x == 0:
        part_v[slot] = bv
        part_i[slot] = bi
    if blocks == 1:
        if pk.thread_idx.x == 0:
            out[row] = bi
        return
    if not last_block_done(counter, row, blocks, flag):
        return
    bv, bi = parts_argmax(part_v, part_i, row * blocks, blocks, sv, si)
    if pk.thread_idx.x == 0:
        out[row] = bi


@pk.func
def weight(v: f32, m: f32, inv_temp: f32) -> f32:
    """exp((v - m) / T); 0 for NaN or an all-(-inf) block."""
    w = f32(0.0)
    if v == v and m > f32(NEG_INF):
        w = pk.exp((v - m) * inv_temp)
    return w


@pk.kernel
def sample_temp(x: Ptr[f32, "ro"], u: Ptr[f32, "ro"], out: Ptr[i32], n_draws: i32, n: i32,
                inv_temp: f32, blk_max: Ptr[f32], blk_sum: Ptr[f32], unit_cum: Ptr[f32],
                counter: Ptr[i32], VEC: Const[int], UNITS: Const[int]):
    scratch = pk.shared_array(f32, 32)
    flag = pk.shared_array(i32, 1)
    tmp = pk.shared_array(f32, 32)   # block_scan's warp totals
    cum = pk.shared_array(f32, MAX_BLOCKS * 4)   # units of this block, then block sums
    vals = pk.local_array(f32, 4 * UNITS)
    tid = pk.thread_idx.x
    units = UNITS * pk.block_dim.x
    m = f32(NEG_INF)
    span_values(x, n, vals, f32(NEG_INF), UNITS, VEC)
    for k in pk.static_range(4 * UNITS):
        if vals[k] == vals[k]:
            m = max(m, vals[k])
    m = block_max(m, scratch)
    for j in pk.static_range(UNITS):
        cum[j * pk.block_dim.x + tid] = (
            weight(vals[4 * j], m, inv_temp) + weight(vals[4 * j + 1], m, inv_temp)) + (
            weight(vals[4 * j + 2], m, inv_temp) + weight(vals[4 * j + 3], m, inv_temp))
    pk.syncthreads()
    block_scan(cum, units, tmp, PASS_THREADS)
    for k in range(tid, units, pk.block_dim.x):
        unit_cum[pk.block_idx.x * units + k] = cum[k]
    if tid == 0:
        blk_max[pk.block_idx.x] = m
        blk_sum[pk.block_idx.x] = cum[units - 1]
    if not last_block_done(counter, 0, pk.grid_dim.x, flag):
        return
    blocks = pk.grid_dim.x
    gm = f32(NEG_INF)
    for k in range(tid, blocks, pk.block_dim.x):
        gm = max(gm, blk_max[k])
    gm = block_max(gm, scratch)
    for k in range(tid, blocks, pk.block_dim.x):
        cum[k] = blk_sum[k] * weight(blk_max[k], gm, inv_temp)
    pk.syncthreads()
    block_scan(cum, blocks, tmp, PASS_THREADS)
    for q in range(tid, n_draws, pk.block_dim.x):
        pick = -1   # no finite largest logit (all NaN, only -Inf, or +Inf): nothing to draw
        if finite(gm):
            pick = draw_temp(x, u[q] * cum[blocks - 1], cum, blocks, gm, inv_temp, blk_max,
                             unit_cum, units, n, VEC)
        out[q] = pick


@pk.func
def draw_temp(x, target: f32, cum, blocks: i32, gm: f32, inv_temp: f32, blk_max, unit_cum,
              units: i32, n: i32, VEC: Const[int]) -> i32:
    """Block, then unit, then element whose cumulative weight first exceeds target."""
    b = search_cum(cum, blocks, target)
    start = f32(0.0)
    if b > 0:
        start = cum[b - 1]
    m = blk_max[b]
    scale = weight(m, gm, inv_temp)
    r = f32(0.0)
    if scale > 0.0:
        r = (target - start) / scale   # in the block's own (max m) weight units
    ucum = unit_cum + i64(b) * i64(units)
    k = search_cum(ucum, units, r)
    acc = f32(0.0)
    if k > 0:
        acc = ucum[k - 1]
    c = b * 4 * units + k * 4
    nan = f32(0.0) / f32(0.0)
    a, bb, d, e = nan, nan, nan, nan
    if c < n:
        a, bb, d, e = unit_values(x, c, n, VEC)
    pick = -1
    last = c
    for q in pk.static_range(4):
        v = a if q == 0 else (bb if q == 1 else (d if q == 2 else e))
        w = weight(v, m, inv_temp)
        if w > 0.0:
            last = c + q
            acc += w
            if pick < 0 and acc > r:
                pick = c + q
    return pick if pick >= 0 else last   # rounding pushed r past the unit: its last weight
