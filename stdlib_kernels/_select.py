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
    """Inclusive prefix sum of arr[0:length] in place (shared arr, its writes followed by a
    barrier before the call; scratch: shared f32[32] of its own; BLOCK: the launch's block
    size). Each thread scans a contiguous chunk serially, collectives.block_scan gives every
    chunk its offset (warp shuffles, two barriers). Accurate to a few ulp of the total; as
    with any tree order, a chunk's offset need not equal the previous chunk's last sum bit
    for bit, so at chunk boundaries the result can step back by an ulp (search_cum still
    returns an entry whose cumulative weight exceeds its target)."""
    per = (length + BLOCK - 1) // BLOCK
    lo = min(length, pk.thread_idx.x * per)
    hi = min(length, lo + per)
    run = f32(0.0)
    for i in range(lo, hi):
        run += arr[i]
        arr[i] = run
    before, _total = C.block_scan(run, scratch, False, BLOCK)
    for i in range(lo, hi):
        arr[i] += before
    pk.syncthreads()


@pk.func
def search_cum(cum, length: i32, target: f32) -> i32:
    """First i with cum[i] > target (cum non-decreasing); when rounding put target at or past
    the total, the first i reaching the total: the last entry with positive weight."""
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
