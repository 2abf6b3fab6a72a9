"""Block collectives (CUB's idea in pykernel): `@pk.func` device functions that a kernel calls
with all threads of a warp or block, inlined into it.

Input: values in registers (and a caller-owned shared scratch array); output: values in
registers, or shared memory (histogram, sort). Generic where the DSL allows: an unannotated
`v` takes the caller's type (i32, u32, f32: 32-bit values, one `shfl.sync` per step; 64-bit
values cost two). Block functions take `BLOCK: Const[int]` (the launch's block size, a multiple
of 32, <= 1024) and a `scratch = pk.shared_array(T, 32)` of v's type that the caller allocates
(one per concurrent use; calls may reuse it back to back: each ends with a barrier).

    warp_reduce, group_reduce (WIDTH lanes), block_reduce (SUM / MAX / MIN)
                                                       shfl.sync.bfly, st/ld.shared, bar.sync
    warp_scan, block_scan (inclusive / exclusive sum)  shfl.sync.up / idx, bar.sync
    histogram_clear / histogram_count / block_histogram / histogram_flush
                                                       atom.shared.add, atom.global.add
    block_sort, block_sort_pairs (bitonic, ascending)  ld/st.shared, bar.sync per stage
    load4 / store4 (4 x f32, scalar tail)              ld.global[.nc].v4.b32 / st.global.v4.b32
"""
import pykernel as pk
from pykernel import Const, f32, i32

SUM = 0
MAX = 1
MIN = 2


@pk.func
def combine(a, b, OP: Const[int]):
    """a OP b for OP in SUM / MAX / MIN (compile-time: one instruction, add / max / min)."""
    if OP == SUM:
        return a + b
    elif OP == MAX:
        return max(a, b)
    else:
        return min(a, b)


@pk.func
def warp_reduce(v, OP: Const[int]):
    """v reduced (SUM / MAX / MIN) over the 32 lanes of the warp, the result in every lane.

    Called by all 32 lanes of the warp (converged). No shared memory, no barrier. PTX: five
    `shfl.sync.bfly.b32` (offsets 16, 8, 4, 2, 1), each followed by add / max / min. Every
    lane combines the same values in the same tree, so float sums agree bit for bit."""
    return group_reduce(v, OP, 32)


@pk.func
def group_reduce(v, OP: Const[int], WIDTH: Const[int]):
    """v reduced over each aligned group of WIDTH lanes (WIDTH a power of two, 1..32: lanes
    0..WIDTH-1, WIDTH..2*WIDTH-1, ...), the group's result in each of its lanes: several
    rows per warp, or the partials of a few warps. Called by all 32 lanes (converged).
    PTX: log2(WIDTH) `shfl.sync.bfly.b32` (offsets WIDTH/2 .. 1) and add / max / min."""
    for k in pk.static_range(5):
        if (16 >> k) < WIDTH:
            v = combine(v, pk.shfl_xor(v, 16 >> k), OP)
    return v


@pk.func
def first_lanes_reduce(v, count: i32, OP: Const[int]):
    """v reduced over lanes 0..count-1 (1 <= count <= 32), the result in every lane; the
    other lanes' values are ignored, so no identity element is needed. PTX: five
    `shfl.sync.down.b32` (a tree into lane 0) and one `shfl.sync.idx.b32` (broadcast)."""
    lane = pk.lane_id()
    for k in pk.static_range(5):
        other = pk.shfl_down(v, 16 >> k)
        if lane + (16 >> k) < count:
            v = combine(v, other, OP)
    return pk.shfl_idx(v, 0)


@pk.func
def block_reduce(v, scratch, OP: Const[int], BLOCK: Const[int]):
    """v reduced (SUM / MAX / MIN) over the BLOCK threads of the block, the result in every
    thread.

    Called by all threads of the block (BLOCK = block_dim.x, a multiple of 32, <= 1024), none
    of them inside a divergent branch. Shared memory: `scratch`, BLOCK // 32 elements of v's
    type (`pk.shared_array(T, 32)` fits every block size). Barriers: two `bar.sync 0` (partials
    written -> read; reads done -> scratch free again), none for BLOCK == 32. PTX: warp_reduce's
    five `shfl.sync.bfly`, `st.shared` of lane 0's partial per warp, then every warp reads the
    BLOCK // 32 partials (`ld.shared`) and reduces them with `shfl.sync.down` + one
    `shfl.sync.idx`, so all threads get the same bits without a broadcast slot."""
    v = warp_reduce(v, OP)
    if BLOCK > 32:
        NW = BLOCK // 32
        lane = pk.lane_id()
        if lane == 0:
            scratch[pk.thread_idx.x // 32] = v
        pk.syncthreads()
        v = first_lanes_reduce(scratch[min(lane, NW - 1)], NW, OP)
        pk.syncthreads()
    return v


@pk.func
def warp_scan(v, INCLUSIVE: Const[bool]):
    """Prefix sum of v over the warp's lanes: lane i gets v_0 + ... + v_i (INCLUSIVE) or
    v_0 + ... + v_{i-1} (exclusive; lane 0 gets 0).

    Called by all 32 lanes of the warp (converged). No shared memory, no barrier. PTX:
    Kogge-Stone, five `shfl.sync.up.b32` (deltas 1, 2, 4, 8, 16) and predicated adds; the
    exclusive form adds one `shfl.sync.up` by 1 (no subtraction: exact for floats too)."""
    lane = pk.lane_id()
    for k in pk.static_range(5):
        other = pk.shfl_up(v, 1 << k)
        if lane >= (1 << k):
            v += other
    if not INCLUSIVE:
        prev = pk.shfl_up(v, 1)
        v = prev if lane > 0 else 0
    return v


@pk.func
def block_scan(v, scratch, INCLUSIVE: Const[bool], BLOCK: Const[int]):
    """(prefix sum of v over the block in thread order, block total), in every thread:
    thread t gets v_0 + ... + v_t (INCLUSIVE) or v_0 + ... + v_{t-1} (exclusive, 0 for
    thread 0). The total lets a loop over tiles carry a running offset.

    Called by all threads of the block (BLOCK = block_dim.x, a multiple of 32, <= 1024),
    converged. Shared memory: `scratch`, BLOCK // 32 elements of v's type (warp totals).
    Barriers: two `bar.sync 0` (totals written -> read; read -> scratch free), none for
    BLOCK == 32. PTX: warp_scan (`shfl.sync.up`), lane 31's total `st.shared`, then each warp
    scans the warp totals itself (`ld.shared` + `shfl.sync.up`) and takes its offset and the
    block total with two `shfl.sync.idx`."""
    lane = pk.lane_id()
    inc = warp_scan(v, True)
    prev = pk.shfl_up(inc, 1)
    exc = prev if lane > 0 else 0          # exclusive without subtracting: exact for floats
    total = pk.shfl_idx(inc, 31)
    if BLOCK > 32:
        NW = BLOCK // 32
        w = pk.thread_idx.x // 32
        if lane == 31:
            scratch[w] = inc
        pk.syncthreads()
        t = scratch[lane] if lane < NW else 0
        t = warp_scan(t, True)
        offset = pk.shfl_idx(t, max(w - 1, 0))
        total = pk.shfl_idx(t, NW - 1)
        if w > 0:
            inc += offset
            exc += offset
        pk.syncthreads()
    if INCLUSIVE:
        return inc, total
    else:
        return exc, total


@pk.func
def histogram_clear(bins, BINS: Const[int], BLOCK: Const[int]):
    """Zero the shared array `bins` (BINS counters, i32 or u32) and wait for it (one
    `bar.sync 0`). Called by all BLOCK threads; each zeroes every BLOCK-th bin."""
    for b in range(pk.thread_idx.x, BINS, BLOCK):
        bins[b] = 0
    pk.syncthreads()


@pk.func
def histogram_count(bins, b: i32, BINS: Const[int]):
    """Count one item in bin b of the shared histogram `bins`; b outside [0, BINS) (a masked
    or out-of-range item) counts nothing. Any subset of threads may call it, any number of
    times, between histogram_clear and the barrier that precedes reading the counts. PTX: one
    `atom.shared.add.u32` per item."""
    if b >= 0 and b < BINS:
        pk.atomic_add(bins, b, 1)


@pk.func
def block_histogram(bins, b: i32, BINS: Const[int], BLOCK: Const[int]):
    """Histogram of one bin index per thread (b outside [0, BINS) skipped) into the shared
    array `bins` (BINS i32 / u32 counters), complete and visible to every thread on return.

    Called by all BLOCK threads, converged. Shared memory: `bins` (4 * BINS bytes). Barriers:
    two `bar.sync 0` (cleared -> counted -> read). Several items per thread: call
    histogram_clear, histogram_count per item, then `pk.syncthreads()` yourself."""
    histogram_clear(bins, BINS, BLOCK)
    histogram_count(bins, b, BINS)
    pk.syncthreads()


@pk.func
def histogram_flush(bins, out, BINS: Const[int], BLOCK: Const[int]):
    """Add the block's shared counts to the global histogram `out` (BINS counters of the
    same type), so a grid of blocks builds one histogram. Called by all BLOCK threads after the
    barrier that ends the counting; zero bins are skipped. PTX: `ld.shared` +
    `atom.global.add.u32` per nonzero bin (result unused: ptxas emits a RED)."""
    for b in range(pk.thread_idx.x, BINS, BLOCK):
        c = bins[b]
        if c != 0:
            pk.atomic_add(out, b, c)


@pk.func
def bitonic_stage(keys, vals, k: i32, j: i32, PAIRS: Const[bool], N: Const[int],
                  BLOCK: Const[int]):
    """One compare-exchange stage of the bitonic network (block size k, distance j): the
    N / 2 pairs (i, i + j) are split over the BLOCK threads; a pair is sorted ascending when
    bit k of i is clear, descending otherwise."""
    for p in range(pk.thread_idx.x, N // 2, BLOCK):
        i = 2 * j * (p // j) + p % j        # p's pair: i has bit j clear
        a = keys[i]
        b = keys[i + j]
        if (a > b) == ((i & k) == 0):       # out of order for this half's direction
            keys[i] = b
            keys[i + j] = a
            if PAIRS:
                va = vals[i]
                vals[i] = vals[i + j]
                vals[i + j] = va
    pk.syncthreads()


@pk.func
def bitonic_sort(keys, vals, PAIRS: Const[bool], N: Const[int], BLOCK: Const[int]):
    k = 2
    while k <= N:
        j = k // 2
        while j > 0:
            bitonic_stage(keys, vals, k, j, PAIRS, N, BLOCK)
            j = j // 2
        k = k * 2


@pk.func
def block_sort(keys, N: Const[int], BLOCK: Const[int]):
    """Sort the N keys of the shared array `keys` ascending (bitonic network, not stable).

    N a power of two (>= 2), any BLOCK (N = BLOCK * ITEMS, or more or fewer keys than
    threads): pad a partial tile with the largest key (+inf, 0x7fffffff) and it sorts to the
    end. Keys compare with `>` (i32, u32, f32, ...; NaN keys
    leave the order undefined). Called by all BLOCK threads, converged, after a barrier that
    ends the writes of `keys`; on return the sorted keys are visible to every thread.
    Shared memory: `keys` itself (in place). Barriers: log2(N) (log2(N) + 1) / 2 `bar.sync 0`,
    one per stage; each stage is N / 2 compare-exchanges (`ld.shared` x 2, `setp`, two
    predicated `st.shared`) spread over the block."""
    bitonic_sort(keys, keys, False, N, BLOCK)


@pk.func
def block_sort_pairs(keys, vals, N: Const[int], BLOCK: Const[int]):
    """block_sort that moves `vals[i]` (a second shared array of N values, any type) with
    `keys[i]`: argsort by passing the indices as values. Same callers, barriers and padding;
    equal keys end in an unspecified order of their values."""
    bitonic_sort(keys, vals, True, N, BLOCK)


@pk.func
def load4(p, i: i32, n: i32, fill: f32, VEC: Const[bool]):
    """Elements i .. i + 3 of the f32 pointer p as four f32, `fill` past n (-inf before a max,
    0 before a sum).

    Per thread, no barrier. VEC (a compile-time promise: p 16-byte aligned, i a multiple of 4):
    one `ld.global.v4.b32` (`.nc` for a "ro" pointer) when the four are all inside n, else the
    scalar tail: up to four predicated `ld.global.b32`. Without VEC always the scalar path
    (a row whose start is not 16-byte aligned: row * n with n % 4 != 0)."""
    a = fill
    b = fill
    c = fill
    d = fill
    if VEC:
        if i + 4 <= n:
            a, b, c, d = pk.load_vec(p, i, 4)
        else:
            a, b, c, d = load4_tail(p, i, n, fill)
    else:
        a, b, c, d = load4_tail(p, i, n, fill)
    return a, b, c, d


@pk.func
def load4_tail(p, i: i32, n: i32, fill: f32):
    return (p[i] if i < n else fill, p[i + 1] if i + 1 < n else fill,
            p[i + 2] if i + 2 < n else fill, p[i + 3] if i + 3 < n else fill)


@pk.func
def store4(p, i: i32, n: i32, a: f32, b: f32, c: f32, d: f32, VEC: Const[bool]):
    """Store a, b, c, d to elements i .. i + 3 of the f32 pointer p, dropping those at or past
    n. Per thread, no barrier. VEC (p 16-byte aligned, i a multiple of 4): one
    `st.global.v4.b32` when all four are inside n; else predicated scalar `st.global.b32`."""
    if VEC:
        if i + 4 <= n:
            pk.store_vec(p, i, (a, b, c, d))
        else:
            store4_tail(p, i, n, a, b, c, d)
    else:
        store4_tail(p, i, n, a, b, c, d)


@pk.func
def store4_tail(p, i: i32, n: i32, a: f32, b: f32, c: f32, d: f32):
    if i < n:
        p[i] = a
    if i + 1 < n:
        p[i + 1] = b
    if i + 2 < n:
        p[i + 2] = c
    if i + 3 < n:
        p[i + 3] = d
