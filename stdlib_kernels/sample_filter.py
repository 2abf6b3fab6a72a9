"""The filtered sampler (top-k / top-p / min-p, then temperature) in two multi-block launches;
see sample_kernels.py for the scheme and sampling.py for the semantics.

sample_hist: x (n,) -> hist (4096 i32, left zeroed), blk_max/blk_sum per block, and params
[M, Z, B] (global max, sum of exp(x - M) over all logits, lowest bin B with at most
CANDIDATES logits at or above it; B = 4096 when even the top bin holds more).
sample_pick: params -> candidates (value, index) of the logits in bins >= B, then in its last
block the thresholds, the survivors sorted by index, and the draws: out[0:n_draws].
"""
import pykernel as pk
from pykernel import Const, Ptr, bool_, f32, i32, u32

from ._device import NEG_INF, block_max, block_sum, finite
from ._select import (block_scan, last_block_done, order_key, radix_select, search_cum,
                      warp_slot)
from .sample_full import draw_full
from .sample_kernels import (CANDIDATES, HIST_BINS, PASS_THREADS, SAMPLE_THREADS,
                             count_before_bins, span_values, unit_values)

BINS_PER_THREAD = HIST_BINS // PASS_THREADS


@pk.kernel
def sample_hist(x: Ptr[f32, "ro"], n: i32, top_k: i32, min_p: f32, blk_max: Ptr[f32],
                blk_sum: Ptr[f32], hist: Ptr[i32], params: Ptr[f32], counter: Ptr[i32],
                VEC: Const[int], UNITS: Const[int]):
    scratch = pk.shared_array(f32, 32)
    flag = pk.shared_array(i32, 1)
    counts = pk.shared_array(i32, HIST_BINS)
    scan_tmp = pk.shared_array(f32, 32)   # count_before_bins' warp totals
    vals = pk.local_array(f32, 4 * UNITS)
    tid = pk.thread_idx.x
    for k in range(tid, HIST_BINS, pk.block_dim.x):
        counts[k] = 0
    m = f32(NEG_INF)
    span_values(x, n, vals, f32(0.0) / f32(0.0), UNITS, VEC)
    for k in pk.static_range(4 * UNITS):
        if vals[k] == vals[k]:
            m = max(m, vals[k])
    pk.syncthreads()
    m = block_max(m, scratch)
    s = f32(0.0)
    for k in pk.static_range(4 * UNITS):
        v = vals[k]
        if v == v:
            pk.atomic_add(counts, i32(order_key(v) >> u32(20)), 1)
            if m > f32(NEG_INF):
                s += pk.exp(v - m)
    s = block_sum(s, scratch)   # starts with a barrier: the histogram is complete after it
    for k in range(tid, HIST_BINS, pk.block_dim.x):
        if counts[k] > 0:
            pk.atomic_add(hist, k, counts[k])
    if tid == 0:
        blk_max[pk.block_idx.x] = m
        blk_sum[pk.block_idx.x] = s
    if last_block_done(counter, 0, pk.grid_dim.x, flag):
        merge_hist(hist, params, blk_max, blk_sum, top_k, min_p, scan_tmp, scratch)


@pk.func
def merge_hist(hist, params, blk_max, blk_sum, top_k: i32, min_p: f32, scan_tmp, scratch):
    """Last block of sample_hist: global max and mass, the candidate bin; zeroes hist.
    The bin is the one holding the k-th largest logit (top-k on), else min-p's threshold
    (min-p on), but never below the lowest bin that keeps <= CANDIDATES logits."""
    tid = pk.thread_idx.x
    blocks = pk.grid_dim.x
    gm = f32(NEG_INF)
    for b in range(tid, blocks, pk.block_dim.x):
        gm = max(gm, blk_max[b])
    gm = block_max(gm, scratch)
    z = f32(0.0)
    for b in range(tid, blocks, pk.block_dim.x):
        if blk_max[b] > f32(NEG_INF):
            z += blk_sum[b] * pk.exp(blk_max[b] - gm)
    z = block_sum(z, scratch)
    top_bin, cum = count_before_bins(hist, scan_tmp)
    lowest = f32(HIST_BINS)   # lowest bin with <= CANDIDATES logits at or above it
    kth = f32(-1.0)           # bin of the k-th largest logit
    for k in pk.static_range(BINS_PER_THREAD):
        cum += f32(hist[top_bin - k])
        if cum <= f32(CANDIDATES):
            lowest = f32(top_bin - k)
        if kth < 0.0 and cum >= f32(top_k):
            kth = f32(top_bin - k)
    lowest = -block_max(-lowest, scratch)
    kth = block_max(kth, scratch)
    for k in pk.static_range(BINS_PER_THREAD):
        hist[top_bin - k] = 0
    wanted = lowest
    if top_k > 0:
        wanted = max(kth, 0.0)
    elif min_p > 0.0:
        wanted = f32(i32(order_key(gm + pk.log(min_p)) >> u32(20)))
    if tid == 0:
        params[0] = gm
        params[1] = z
        params[2] = max(wanted, lowest)


@pk.kernel
def sample_pick(x: Ptr[f32, "ro"], u: Ptr[f32, "ro"], out: Ptr[i32], n_draws: i32, n: i32,
                top_k: i32, top_p: f32, min_p: f32, inv_temp: f32, params: Ptr[f32],
                cand_v: Ptr[f32], cand_i: Ptr[i32], counters: Ptr[i32], VEC: Const[int]):
    scratch = pk.shared_array(f32, 32)
    flag = pk.shared_array(i32, 1)
    local = pk.shared_array(i32, 2)   # this block's candidate count, then its base
    cv = pk.shared_array(f32, CANDIDATES)
    ci = pk.shared_array(i32, CANDIDATES)
    sw = pk.shared_array(f32, CANDIDATES)
    si = pk.shared_array(i32, CANDIDATES)
    hist = pk.shared_array(f32, 256)
    bcast = pk.shared_array(f32, 2)
    tid = pk.thread_idx.x
    if tid == 0:
        local[0] = 0
    pk.syncthreads()
    bound = u32(i32(params[2]))
    c = (pk.block_idx.x * pk.block_dim.x + tid) * 4
    nan = f32(0.0) / f32(0.0)
    a, b, d, e = nan, nan, nan, nan
    if c < n:
        a, b, d, e = unit_values(x, c, n, VEC)
    sa = claim(a, bound, local)
    sb = claim(b, bound, local)
    sd = claim(d, bound, local)
    se = claim(e, bound, local)
    pk.syncthreads()
    if tid == 0:
        local[1] = pk.atomic_add(counters, 1, local[0])
    pk.syncthreads()
    base = local[1]
    put(cand_v, cand_i, base, sa, a, c)
    put(cand_v, cand_i, base, sb, b, c + 1)
    put(cand_v, cand_i, base, sd, d, c + 2)
    put(cand_v, cand_i, base, se, e, c + 3)
    if not last_block_done(counters, 0, pk.grid_dim.x, flag):
        return
    total = counters[1]
    pk.syncthreads()
    if tid == 0:
        counters[1] = 0
    ok = total <= CANDIDATES and bound < u32(HIST_BINS)
    count = min(total, CANDIDATES)
    for k in range(tid, count, pk.block_dim.x):
        cv[k] = cand_v[k]
        ci[k] = cand_i[k]
    pk.syncthreads()
    draw_from_candidates(x, u, out, n_draws, n, cv, ci, count, ok, bound << u32(20),
                         params[0], params[1], top_k, top_p, min_p, inv_temp, sw, si, local,
                         hist, bcast, scratch)


@pk.func
def draw_from_candidates(x, u, out, n_draws: i32, n: i32, cv, ci, count: i32, ok: bool_,
                         low_key: u32, m: f32, z_all: f32, top_k: i32, top_p: f32, min_p: f32,
                         inv_temp: f32, sw, si, local, hist, bcast, scratch):
    """The draws from a candidate list in shared memory (cv values, ci indices, `count` of
    them, every logit with key >= low_key; m the row's max, z_all its softmax mass, needed
    with top-k off): the thresholds, the survivors sorted by index, out[0:n_draws] for the
    uniforms u; -1 each where m is not finite (m block-uniform: the branch keeps the block's
    barriers together). Where the candidates cannot decide (ok false, or they hold no
    survivor), the exact single-block pass over the whole row x decides. Every thread of the
    block calls."""
    if not finite(m):   # no finite largest logit (all NaN, only -Inf, or +Inf): -1
        for k in range(pk.thread_idx.x, n_draws, pk.block_dim.x):
            out[k] = -1
    else:
        floor, ok = candidate_floor(cv, count, ok, low_key, n, m, z_all, top_k, top_p, min_p,
                                    hist, bcast, scratch)
        kept = 0
        if ok:
            kept = gather_survivors(cv, ci, count, floor, m, inv_temp, sw, si, local)
        if kept == 0:   # the candidates cannot decide: exact single-block pass over all logits
            draw_full(x, u, out, n_draws, n, top_k, top_p, min_p, inv_temp, scratch, sw)
        else:
            tid = pk.thread_idx.x
            # indices are distinct: rank = sorted slot
            for k in range(tid, kept, pk.block_dim.x):
                rank = 0
                for j in range(0, kept):
                    if si[j] < si[k]:
                        rank += 1
                cv[rank] = sw[k]
                ci[rank] = si[k]
            pk.syncthreads()
            block_scan(cv, kept, sw, SAMPLE_THREADS)
            for k in range(tid, n_draws, pk.block_dim.x):
                out[k] = ci[search_cum(cv, kept, u[k] * cv[kept - 1])]


@pk.func
def claim(v: f32, bound: u32, local) -> i32:
    """A slot in this block's candidate list when v's bin is >= bound, else -1."""
    return warp_slot(v == v and (order_key(v) >> u32(20)) >= bound, local, 0)


@pk.func
def put(cand_v, cand_i, base: i32, slot: i32, v: f32, index: i32):
    if slot >= 0 and base + slot < CANDIDATES:
        cand_v[base + slot] = v
        cand_i[base + slot] = index


@pk.func
def candidate_floor(cv, count: i32, ok: bool_, low_key: u32, n: i32, m: f32, z_all: f32,
                    top_k: i32, top_p: f32, min_p: f32, hist, bcast, scratch):
    """(key threshold, valid): valid when every logit at or above the threshold is a
    candidate (all have key >= low_key, the candidates' bin bound) and the filters' inputs
    (the k-th largest, the top-p mass) were computable from the candidates alone."""
    floor = u32(0)
    top_k_on = top_k > 0 and top_k < n
    if ok and top_k_on:
        if count < top_k:
            ok = False
        else:
            floor = radix_select(cv, count, floor, f32(top_k), m, False, hist, bcast)
    min_key = u32(0)
    if min_p > 0.0:
        min_key = order_key(m + pk.log(min_p))
    if ok and top_p < 1.0:
        have = f32(0.0)
        for k in range(pk.thread_idx.x, count, pk.block_dim.x):
            if order_key(cv[k]) >= floor:
                have += pk.exp(cv[k] - m)
        have = block_sum(have, scratch)
        z = have if top_k_on else z_all
        if have >= top_p * z:
            floor = max(floor, radix_select(cv, count, floor, top_p * z, m, True, hist, bcast))
        elif min_key < low_key:   # top-p's cut lies below the candidates; min-p's too
            ok = False
    floor = max(floor, min_key)
    if floor < low_key:
        ok = False
    return floor, ok


@pk.func
def gather_survivors(cv, ci, count: i32, floor: u32, m: f32, inv_temp: f32, sw, si,
                     local) -> i32:
    """Candidates with key >= floor -> (si: index, sw: weight exp((v - m) / T)), unordered."""
    pk.syncthreads()
    if pk.thread_idx.x == 0:
        local[0] = 0
    pk.syncthreads()
    for first in range(0, count, pk.block_dim.x):   # same trip count on every lane
        k = first + pk.thread_idx.x
        v = f32(0.0)
        if k < count:
            v = cv[k]
        slot = warp_slot(k < count and order_key(v) >= floor, local, 0)
        if slot >= 0:
            si[slot] = ci[k]
            sw[slot] = pk.exp((v - m) * inv_temp)
    pk.syncthreads()
    kept = local[0]
    pk.syncthreads()
    return kept
