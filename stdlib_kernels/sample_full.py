"""The exact single-block sampler over a whole vocabulary (@pk.func): thresholds by 32-step
bisections over the order keys of all logits, then a draw over per-thread contiguous chunks.
O(64 passes over the logits, LOADS loads in flight per thread): the multi-block path
(sample_filter.py) calls it only when its candidate list cannot hold every survivor.

Input: logits x (n,), uniforms u (n_draws,), filter settings; shared scratch (f32[32]) and
sums (f32, >= block_dim). Output: out[0:n_draws] token ids.
"""
import pykernel as pk
from pykernel import Const, f32, i32, u32

from ._device import NEG_INF, block_max, block_sum, exp_nonpositive
from ._select import order_key


LOADS = 8   # logits in flight per thread: one block streams the row, and one dependent L2
            # load per loop step left it latency-bound (~13 GB/s, ~90 us per pass at 262144)


@pk.func
def mass_at_least(x, n: i32, key: u32, floor: u32, m: f32, WEIGHTED: Const[bool],
                  scratch) -> f32:
    """Count (or softmax weight exp(x - m)) of logits whose key is >= key and >= floor."""
    acc = f32(0.0)
    step = pk.block_dim.x
    vals = pk.local_array(f32, LOADS)
    for c0 in range(pk.thread_idx.x, n, step * LOADS):
        for j in pk.static_range(LOADS):
            vals[j] = x[min(c0 + j * step, n - 1)]
        for j in pk.static_range(LOADS):
            v = vals[j]
            k = order_key(v)
            if c0 + j * step < n and v == v and k >= key and k >= floor:
                if WEIGHTED:
                    acc += exp_nonpositive(v - m)
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


@pk.func
def full_floor(x, n: i32, m: f32, top_k: i32, top_p: f32, min_p: f32, scratch) -> u32:
    """The key threshold of top-k, then top-p, then min-p over all n logits."""
    floor = u32(0)
    if top_k > 0 and top_k < n:
        floor = select_key(x, n, floor, f32(top_k), m, False, scratch)
    if top_p < 1.0:
        z = mass_at_least(x, n, floor, floor, m, True, scratch)
        floor = max(floor, select_key(x, n, floor, top_p * z, m, True, scratch))
    if min_p > 0.0:
        floor = max(floor, order_key(m + pk.log(min_p)))
    return floor


@pk.func
def draw_full(x, u, out, n_draws: i32, n: i32, top_k: i32, top_p: f32, min_p: f32,
              inv_temp: f32, scratch, sums):
    tid = pk.thread_idx.x
    m = f32(NEG_INF)
    step = pk.block_dim.x
    for c0 in range(tid, n, step * LOADS):
        for j in pk.static_range(LOADS):
            if c0 + j * step < n:
                m = max(m, x[c0 + j * step])
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
