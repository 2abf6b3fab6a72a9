"""Each row's largest logits as a short candidate list, so that a host sampler (top-k on)
reads a few hundred values per row instead of the whole vocabulary: x (rows, n) f32 ->
per row up to `cap` (value, index) pairs, in no order, holding every logit whose 4096-bin
order-key histogram bin (top 12 bits of the order key, 1/8 of an octave wide) is at or above
the bin of the row's k-th largest logit, so the k largest are always among them; NaN never.

Two launches, grid (blocks per row, rows), PASS_THREADS threads a block:
- rows_hist: each block counts its span into a shared histogram and adds it to the row's
  global one; the row's last block (atomic ticket) finds the k-th largest's bin, stores it,
  zeroes the row's histogram and candidate count (so the launches replay with no memset).
- rows_pick: each logit at or above its row's bin takes a slot (one atomic per warp, then
  one per block) and is written while the slot is below `cap`; the count goes on past cap, so
  a caller sees a list that overflowed (a row flat at the top) and takes that row another way.
Wrapper: sampling.top_k_candidates.
"""
import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64, u32

from ._device import block_max
from ._select import last_block_done, order_key, warp_slot
from .sample_kernels import (HIST_BINS, PASS_THREADS, count_before_bins, span_values,
                             unit_values)

BINS_PER_THREAD = HIST_BINS // PASS_THREADS


@pk.kernel
def rows_hist(x: Ptr[f32, "ro"], n: i32, k: i32, hist: Ptr[i32], tickets: Ptr[i32],
              bound: Ptr[i32], counts: Ptr[i32], VEC: Const[int], UNITS: Const[int]):
    counts_s = pk.shared_array(i32, HIST_BINS)
    scan_tmp = pk.shared_array(f32, 32)   # count_before_bins' warp totals
    flag = pk.shared_array(i32, 1)
    scratch = pk.shared_array(f32, 32)
    tid = pk.thread_idx.x
    row = pk.block_idx.y
    xr = x + i64(row) * i64(n)
    for h in range(tid, HIST_BINS, pk.block_dim.x):
        counts_s[h] = 0
    pk.syncthreads()
    span = pk.block_idx.x * (4 * UNITS * pk.block_dim.x)
    for j in pk.static_range(UNITS):
        c = span + (j * pk.block_dim.x + tid) * 4
        if c < n:
            a, b, d, e = unit_values(xr, c, n, VEC)
            count_bin(a, counts_s)
            count_bin(b, counts_s)
            count_bin(d, counts_s)
            count_bin(e, counts_s)
    pk.syncthreads()
    row_hist = hist + i64(row) * i64(HIST_BINS)
    for h in range(tid, HIST_BINS, pk.block_dim.x):
        if counts_s[h] > 0:
            pk.atomic_add(row_hist, h, counts_s[h])
    if not last_block_done(tickets, row, pk.grid_dim.x, flag):
        return
    top_bin, cum = count_before_bins(row_hist, scan_tmp)
    kth = -1                  # the bin where the count from the top first reaches k
    for j in pk.static_range(BINS_PER_THREAD):
        cum += f32(row_hist[top_bin - j])
        if kth < 0 and cum >= f32(k):
            kth = top_bin - j
    pk.syncthreads()          # every thread has read the row's histogram before it is zeroed
    for j in pk.static_range(BINS_PER_THREAD):
        row_hist[top_bin - j] = 0
    best = block_max(f32(kth), scratch)
    if tid == 0:
        bound[row] = max(i32(best), 0)   # fewer than k numbers in the row: all of them
        counts[row] = 0


@pk.func
def count_bin(v: f32, counts_s):
    if v == v:
        pk.atomic_add(counts_s, i32(order_key(v) >> u32(20)), 1)


@pk.kernel
def rows_pick(x: Ptr[f32, "ro"], n: i32, bound: Ptr[i32, "ro"], counts: Ptr[i32],
              cand_v: Ptr[f32], cand_i: Ptr[i32], cap: i32, VEC: Const[int],
              UNITS: Const[int]):
    local = pk.shared_array(i32, 2)   # this block's candidate count, then its base
    tid = pk.thread_idx.x
    row = pk.block_idx.y
    xr = x + i64(row) * i64(n)
    low = u32(bound[row])
    if tid == 0:
        local[0] = 0
    pk.syncthreads()
    vals = pk.local_array(f32, 4 * UNITS)
    slots = pk.local_array(i32, 4 * UNITS)
    span_values(xr, n, vals, f32(0.0) / f32(0.0), UNITS, VEC)
    for q in pk.static_range(4 * UNITS):  # every lane of a warp calls warp_slot together
        v = vals[q]
        slots[q] = warp_slot(v == v and (order_key(v) >> u32(20)) >= low, local, 0)
    pk.syncthreads()
    if tid == 0:
        local[1] = pk.atomic_add(counts, row, local[0])
    pk.syncthreads()
    base = local[1]
    out = i64(row) * i64(cap)
    span = pk.block_idx.x * (4 * UNITS * pk.block_dim.x)
    for j in pk.static_range(UNITS):
        c = span + (j * pk.block_dim.x + tid) * 4
        for q in pk.static_range(4):
            s = slots[4 * j + q]
            if s >= 0 and base + s < cap:
                cand_v[out + i64(base + s)] = vals[4 * j + q]
                cand_i[out + i64(base + s)] = c + q
