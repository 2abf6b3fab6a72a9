"""Device helpers (@pk.func) for the multi-block samplers: order-preserving float keys,
(value, index) argmax merging, the "last block done" ticket, an in-place block prefix sum,
a cumulative-weight search and a radix select over keys held in shared memory.

Every helper that synchronizes must be called by all threads of the block.
"""
import pykernel as pk
from pykernel import Const, bool_, f32, i32, u32, u64

from . import collectives as C
from ._device import NEG_INF

BIG_INDEX = 2**31 - 1


@pk.func
def order_key(x: f32) -> u32:
    """u32 whose unsigned order is the float order (NaN excluded by callers)."""
    bits = pk.bitcast(x, u32)
    return bits ^ (u32(0xFFFFFFFF) if (bits >> 31) == u32(1) else u32(0x80000000))


@pk.func
def better(v: f32, i: i32, bv: f32, bi: i32) -> bool:
    """(v, i) beats (bv, bi): larger value, lower index on ties (NaN never wins)."""
    return v > bv or (v == bv and i < bi)


@pk.func
def warp_argmax(v: f32, i: i32):
    for k in pk.static_range(5):
        ov = pk.shfl_xor(v, 16 >> k)
        oi = pk.shfl_xor(i, 16 >> k)
        if better(ov, oi, v, i):
            v = ov
            i = oi
    return v, i


@pk.func
def block_argmax(v: f32, i: i32, sv, si):
    """(value, index) of the block's best pair, on every thread (sv, si: shared, 32 each)."""
    v, i = warp_argmax(v, i)
    lane = pk.lane_id()
    pk.syncthreads()
    if lane == 0:
        sv[pk.thread_idx.x // 32] = v
        si[pk.thread_idx.x // 32] = i
    pk.syncthreads()
    v = f32(NEG_INF)
    i = i32(BIG_INDEX)
    if lane < (pk.block_dim.x + 31) // 32:
        v = sv[lane]
        i = si[lane]
    return warp_argmax(v, i)


@pk.func
def last_block_done(counter, slot: i32, nblocks: i32, flag) -> bool:
    """True in the block that finishes last among `nblocks` sharing counter[slot]; that block
    sees every global write the others made before calling this, and resets the counter."""
    pk.threadfence()
    pk.syncthreads()
    if pk.thread_idx.x == 0:
        ticket = pk.atomic_add(counter, slot, 1)
        flag[0] = 1 if ticket == nblocks - 1 else 0
        if ticket == nblocks - 1:
            counter[slot] = 0
        pk.threadfence()
    pk.syncthreads()
    return flag[0] == 1


@pk.func
def block_scan(arr, length: i32, scratch, BLOCK: Const[int]):
    """Inclusive prefix sum of the non-negative arr[0:length] in place (shared arr, its writes
    followed by a barrier before the call; scratch: shared f32[32] of its own; BLOCK: the
    launch's block size). Each thread scans a contiguous chunk serially, collectives.block_scan
    gives every chunk its offset, a max scan makes the offsets monotone (warp shuffles, three
    barriers). Accurate to a few ulp of the total, and exact in the two properties a draw
    needs: the result never decreases, and a zero weight repeats its predecessor's sum (0 at
    index 0), so search_cum never lands on a zero weight.

    Why the clamp: the tree gives chunk t an offset `before_t` that need not equal chunk t-1's
    last sum fl(before_{t-1} + run_{t-1}) bit for bit (either way, and the tree's offsets are
    not even monotone), so the plain sum fl(before_t + run_i) can step back by an ulp at a chunk
    boundary, or step up at a leading zero weight: a draw could then pick a zero weight (a
    padding entry). Instead, with end_t = fl(before_t + run_t) for a chunk holding weight (0
    for an all-zero or empty one), stop_t = max(end_0..end_t) and start_t = stop_{t-1}
    (start_0 = 0), chunk t stores
        cum[i] = stop_t                          where run_i == run_t (nothing left to add)
        cum[i] = min(fl(start_t + run_i), stop_t) elsewhere.
    Non-decreasing: run_i never decreases along the chunk (adding w >= 0 cannot lower a
    float), fl(start_t + r) is monotone in r and >= start_t, min keeps the order and the
    values <= stop_t, and once run_i == run_t it stays so; the chunk's last entry is stop_t
    (run_last == run_t), the next chunk starts at >= start_{t+1} = stop_t (empty chunks
    between leave stop unchanged). Zero weight w_i: inside a chunk run_i == run_{i-1}, so both
    take the same branch and value; at a chunk's first entry run_i = 0, so cum[i] = stop_t if
    the chunk is all zero (then stop_t = start_t) else fl(start_t + 0) = start_t, and start_t
    equals the previous non-empty chunk's last entry (0 at index 0). Cost over the plain scan:
    one max scan of the chunk ends (shuffles and one barrier), no extra pass over arr."""
    per = (length + BLOCK - 1) // BLOCK
    lo = min(length, pk.thread_idx.x * per)
    hi = min(length, lo + per)
    run = f32(0.0)
    for i in range(lo, hi):
        run += arr[i]
        arr[i] = run
    before, _total = C.block_scan(run, scratch, False, BLOCK)
    end = f32(0.0)
    if run > 0.0:
        end = before + run
    start, stop = running_max(end, scratch, BLOCK)
    for i in range(lo, hi):
        r = arr[i]
        arr[i] = stop if r == run else min(start + r, stop)
    pk.syncthreads()


@pk.func
def running_max(v: f32, scratch, BLOCK: Const[int]):
    """(max of v over the threads before this one, 0 for thread 0; max including it) for
    v >= 0, in thread order (max is exact, so any tree gives the same bits). One barrier:
    scratch is read after it, so the caller's next barrier must precede any reuse."""
    lane = pk.lane_id()
    inc = v
    for k in pk.static_range(5):
        other = pk.shfl_up(inc, 1 << k)
        if lane >= (1 << k):
            inc = max(inc, other)
    prev = pk.shfl_up(inc, 1)
    exc = prev if lane > 0 else f32(0.0)
    if BLOCK > 32:
        w = pk.thread_idx.x // 32
        if lane == 31:
            scratch[w] = inc
        pk.syncthreads()
        t = scratch[lane] if lane < BLOCK // 32 else f32(0.0)
        for k in pk.static_range(5):
            other = pk.shfl_up(t, 1 << k)
            if lane >= (1 << k):
                t = max(t, other)
        prior = pk.shfl_idx(t, max(w - 1, 0))
        if w > 0:
            inc = max(inc, prior)
            exc = max(exc, prior)
    return exc, inc


@pk.func
def search_cum(cum, length: i32, target: f32) -> i32:
    """First i with cum[i] > target (0 <= target, cum as block_scan leaves it); when rounding
    put target at or past the total, the first i reaching the total. Either way cum[i] >
    cum[i-1] (or i == 0 and cum[0] > 0), which block_scan's result allows only for a positive
    weight: the pick always has weight > 0 when the total is > 0."""
    total = cum[length - 1]
    past = target >= total
    lo = 0
    hi = length - 1
    while lo < hi:
        mid = (lo + hi) // 2
        c = cum[mid]
        if c > target or (past and c >= total):
            hi = mid
        else:
            lo = mid + 1
    return lo


@pk.func
def radix_select(vals, length: i32, floor: u32, target: f32, m: f32, WEIGHTED: Const[bool],
                 hist, bcast) -> u32:
    """Largest key t with measure(key >= max(t, floor)) >= target over vals[0:length] (shared
    f32), measure = count or softmax weight exp(v - m); 0 when even the whole set falls short.
    MSB-first, one 256-bin shared histogram per byte of the key (hist: shared f32[256];
    bcast: shared f32[2])."""
    tid = pk.thread_idx.x
    prefix = u32(0)
    above = f32(0.0)   # measure of keys whose already-fixed high bytes exceed prefix's
    for level in range(4):
        shift = u32(24 - 8 * level)
        high = u32((u64(0xFFFFFFFF) << u64(32 - 8 * level)) & u64(0xFFFFFFFF))
        for b in range(tid, 256, pk.block_dim.x):
            hist[b] = 0.0
        pk.syncthreads()
        for i in range(tid, length, pk.block_dim.x):
            v = vals[i]
            k = order_key(v)
            if v == v and k >= floor and (k & high) == (prefix & high):
                w = f32(1.0)
                if WEIGHTED:
                    w = pk.exp(v - m)
                pk.atomic_add(hist, i32((k >> shift) & u32(255)), w)
        pk.syncthreads()
        if tid < 32:
            digit, new_above = pick_digit(hist, above, target)
            if tid == 0:
                bcast[0] = f32(digit)
                bcast[1] = new_above
        pk.syncthreads()
        prefix = prefix | (u32(i32(bcast[0])) << shift)
        above = bcast[1]
        pk.syncthreads()
    return prefix


@pk.func
def pick_digit(hist, above: f32, target: f32):
    """(largest digit d with above + sum(hist[d:]) >= target, else 0; above + sum(hist[d+1:]))
    computed by one warp, lane l holding bins 8l..8l+7."""
    lane = pk.lane_id()
    own = f32(0.0)
    for b in pk.static_range(8):
        own += hist[8 * lane + b]
    suffix = own   # inclusive suffix sum over lanes >= lane
    for k in pk.static_range(5):
        other = pk.shfl_down(suffix, 1 << k)
        if lane + (1 << k) < 32:
            suffix += other
    higher = above + (suffix - own)   # everything in bins of higher lanes
    acc = higher
    best = -1
    for b in pk.static_range(8):
        bin_measure = hist[8 * lane + 7 - b]
        if best < 0 and acc + bin_measure >= target:
            best = 8 * lane + 7 - b
        acc += bin_measure
    top = max(C.warp_reduce(best, C.MAX), 0)
    above_top = higher   # meaningful in the lane owning bin `top`
    for b in pk.static_range(8):
        if 8 * lane + 7 - b > top:
            above_top += hist[8 * lane + 7 - b]
    return top, pk.shfl_idx(above_top, top // 8)


@pk.func
def popcount(v: u32) -> i32:
    v = v - ((v >> u32(1)) & u32(0x55555555))
    v = (v & u32(0x33333333)) + ((v >> u32(2)) & u32(0x33333333))
    v = (v + (v >> u32(4))) & u32(0x0F0F0F0F)
    return i32((v * u32(0x01010101)) >> u32(24))


@pk.func
def warp_slot(take: bool_, counter, index: i32) -> i32:
    """A slot from counter[index] (atomic add) for each lane with `take`, else -1: one
    atomic per warp instead of one per lane (a shared counter hit by every lane serializes).
    All 32 lanes of the warp must call it together."""
    mask = pk.ballot(take)
    lane = pk.lane_id()
    base = 0
    if lane == 0 and mask != u32(0):
        base = pk.atomic_add(counter, index, popcount(mask))
    base = pk.shfl_idx(base, 0)
    below = popcount(mask & ((u32(1) << u32(lane)) - u32(1)))
    return base + below if take else -1
