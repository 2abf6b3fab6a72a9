"""The exact single-block sampler over a whole vocabulary (@pk.func): thresholds by radix
selection over the order keys of all logits (4 histogram passes per filter), then a draw over
per-thread contiguous chunks. The multi-block path (sample_filter.py) calls it only when its
candidate list cannot hold every survivor (top-k above the list, or a flat top-p nucleus).

Input: logits x (n,), uniforms u (n_draws,), filter settings; shared scratch (f32[32]) and
sums (f32, >= block_dim). Output: out[0:n_draws] token ids.
"""
import pykernel as pk
from pykernel import Const, f32, f64, i32, u32, u64

from ._device import NEG_INF, block_max, block_sum
from ._select import order_key


FIXED_ONE = 1099511627776.0     # 2^40: softmax weights exp(x - m) <= 1 as u64 fixed point, so
                                # 2^23 of them still fit in 63 bits and sums are exact (any order)


@pk.func
def bin_weight(v: f32, m: f32, WEIGHTED: Const[bool]) -> u64:
    if WEIGHTED:
        return u64(pk.exp(v - m) * FIXED_ONE + 0.5)
    else:
        return u64(1)


@pk.func
def pick_bin(hist, pick, above: u64, target: u64, goal: f32, FRACTION: Const[bool]):
    """Warp 0: the largest bin b with above + sum(hist[b:]) >= target (0 if none), into
    pick[0], and above + sum(hist[b + 1:]) into pick[1]. Lane l owns bins 8l .. 8l + 7.
    FRACTION (first pass of a top-p select): target = goal * the histogram's total, kept in
    pick[2] for the later passes."""
    lane = pk.lane_id()
    own = u64(0)
    for j in pk.static_range(8):
        own += hist[8 * lane + j]
    suffix = own                                   # sum over lanes >= this one
    for r in pk.static_range(5):
        other = pk.shfl_down(suffix, 1 << r)
        if lane + (1 << r) < 32:
            suffix += other
    if FRACTION:
        target = u64(f64(goal) * f64(pk.shfl_idx(suffix, 0)))
        pick[2] = target
    run = above + suffix - own                     # mass of the bins above this lane's
    cand = -1
    rest = u64(0)
    for jj in pk.static_range(8):
        j = 7 - jj
        before = run
        run += hist[8 * lane + j]
        if cand < 0 and run >= target:
            cand = 8 * lane + j
            rest = before
    best = cand
    for r in pk.static_range(5):
        best = max(best, pk.shfl_xor(best, 1 << r))
    if best >= 0 and cand == best:
        pick[0] = u64(best)
        pick[1] = rest
    if best < 0 and lane == 0:
        pick[0] = u64(0)
        pick[1] = above + suffix - hist[0]


@pk.func
def select_key(x, n: i32, floor: u32, goal: f32, m: f32, WEIGHTED: Const[bool],
               FRACTION: Const[bool]) -> u32:
    """Largest key t >= floor with mass(t) >= target, where mass(t) is the count (or the
    softmax weight) of logits whose key is >= t and >= floor, and target = goal or, with
    FRACTION, goal * mass(floor). Radix select, 8 bits per pass (4 passes over the logits):
    a 256-bin histogram of the keys that share the prefix chosen so far, summed exactly in
    u64 (fixed point for weights), so the result does not depend on the order of additions."""
    hist = pk.shared_array(u64, 256)
    pick = pk.shared_array(u64, 3)
    tid = pk.thread_idx.x
    prefix = u32(0)
    above = u64(0)
    target = u64(goal)
    for level in pk.static_range(4):
        shift = 24 - 8 * level
        for b in range(tid, 256, pk.block_dim.x):
            hist[b] = u64(0)
        pk.syncthreads()
        for c in range(tid, n, pk.block_dim.x):
            v = x[c]
            k = order_key(v)
            inside = v == v and k >= floor
            if level > 0:
                inside = inside and (k >> u32(shift + 8)) == (prefix >> u32(shift + 8))
            if inside:
                pk.atomic_add(hist, i32((k >> u32(shift)) & u32(255)), bin_weight(v, m, WEIGHTED))
        pk.syncthreads()
        if tid < 32:
            pick_bin(hist, pick, above, target, goal, level == 0 and FRACTION)
        pk.syncthreads()
        prefix = prefix | (u32(pick[0]) << u32(shift))
        above = pick[1]
        if level == 0 and FRACTION:
            target = pick[2]
        pk.syncthreads()
    return prefix


@pk.func
def full_floor(x, n: i32, m: f32, top_k: i32, top_p: f32, min_p: f32, scratch) -> u32:
    """The key threshold of top-k, then top-p, then min-p over all n logits."""
    floor = u32(0)
    if top_k > 0 and top_k < n:
        floor = select_key(x, n, floor, f32(top_k), m, False, False)
    if top_p < 1.0:
        floor = max(floor, select_key(x, n, floor, top_p, m, True, True))
    if min_p > 0.0:
        floor = max(floor, order_key(m + pk.log(min_p)))
    return floor


@pk.func
def draw_full(x, u, out, n_draws: i32, n: i32, top_k: i32, top_p: f32, min_p: f32,
              inv_temp: f32, scratch, sums):
    tid = pk.thread_idx.x
    m = f32(NEG_INF)
    for c in range(tid, n, pk.block_dim.x):
        m = max(m, x[c])
    m = block_max(m, scratch)
    floor = full_floor(x, n, m, top_k, top_p, min_p, scratch)
    # contiguous chunks per thread, block prefix over chunk weights, owner walks its chunk
    chunk = (n + pk.block_dim.x - 1) // pk.block_dim.x
    lo = min(n, tid * chunk)
    hi = min(n, lo + chunk)
    w = f32(0.0)
    for c in range(lo, hi):
        v = x[c]
        if v == v and order_key(v) >= floor:
            w += pk.exp((v - m) * inv_temp)
    pk.syncthreads()
    sums[tid] = w
    pk.syncthreads()
    if tid == 0:   # serial exclusive scan of the per-thread sums: cheap next to the passes
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
