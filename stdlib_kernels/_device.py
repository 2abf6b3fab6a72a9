"""Device helpers (@pk.func, inlined) shared by the core kernels: warp and block reductions,
and the per-warp mbarrier rings of the bulk-copy kernels.

The warp reductions are the library's collectives (collectives.warp_reduce: the same five
`shfl.sync.bfly` steps). Block reductions take a shared scratch array of at least 32 f32 (one slot per warp) and return
the reduced value to every thread; they start with a barrier so one scratch array can be reused
by consecutive reductions. Every thread of the block must call them (no divergent calls).
"""
import pykernel as pk
from pykernel import Const, f32, i32, u32
from pykernel.mathlib import INV_LN2, LN2_HI, LN2_LO, exp_poly

from .collectives import MAX, SUM, warp_reduce

NEG_INF = float("-inf")


@pk.func
def warp_sum(v: f32) -> f32:
    return warp_reduce(v, SUM)


@pk.func
def init_warp_mbarriers(bars, warp: i32, lane: i32, S: Const[int]):
    """Lane 0 initialises the warp's S mbarriers (bars[warp * S .. + S - 1], one arrival per
    phase) and fences them for the async proxy; the warp then syncs (every lane calls it)."""
    if lane == 0:
        for s in pk.static_range(S):
            pk.mbarrier_init(bars, warp * S + s, 1)
        pk.fence_mbarrier_init()
    pk.syncwarp()


@pk.func
def warp_max(v: f32) -> f32:
    return warp_reduce(v, MAX)


@pk.func
def block_sum(v: f32, scratch) -> f32:
    v = warp_sum(v)
    lane = pk.lane_id()
    nwarps = (pk.block_dim.x + 31) // 32
    pk.syncthreads()
    if lane == 0:
        scratch[pk.thread_idx.x // 32] = v
    pk.syncthreads()
    total = f32(0.0)
    if lane < nwarps:
        total = scratch[lane]
    return warp_sum(total)


@pk.func
def block_max(v: f32, scratch) -> f32:
    v = warp_max(v)
    lane = pk.lane_id()
    nwarps = (pk.block_dim.x + 31) // 32
    pk.syncthreads()
    if lane == 0:
        scratch[pk.thread_idx.x // 32] = v
    pk.syncthreads()
    best = f32(NEG_INF)
    if lane < nwarps:
        best = scratch[lane]
    return warp_max(best)


@pk.func
def load4(p, c: i32, n: i32, VEC: Const[int]):
    """Elements c..c+3 of row `p` as f32 (0 past n). VEC == 4: one 16/8-byte vector load
    (c a multiple of 4, n too, row aligned); else scalar loads with a bound check each."""
    if VEC == 4:
        a, b, d, e = pk.load_vec(p, c, 4)
        return f32(a), f32(b), f32(d), f32(e)
    else:
        a = f32(0.0)
        b = f32(0.0)
        d = f32(0.0)
        e = f32(0.0)
        if c < n:
            a = f32(p[c])
        if c + 1 < n:
            b = f32(p[c + 1])
        if c + 2 < n:
            d = f32(p[c + 2])
        if c + 3 < n:
            e = f32(p[c + 3])
        return a, b, d, e


@pk.func
def store4(p, c: i32, n: i32, a: f32, b: f32, d: f32, e: f32, VEC: Const[int], T: Const[pk.dtype]):
    """Store elements c..c+3 of row `p` (converted to T), the same way load4 reads them."""
    if VEC == 4:
        pk.store_vec(p, c, (T(a), T(b), T(d), T(e)))
    else:
        if c < n:
            p[c] = T(a)
        if c + 1 < n:
            p[c + 1] = T(b)
        if c + 2 < n:
            p[c + 2] = T(d)
        if c + 3 < n:
            p[c + 3] = T(e)


@pk.func
def exp_nonpositive(x: f32) -> f32:
    """e**x for x <= 0 (a logit minus its row max) without branches: pykernel's accurate exp
    reduction and polynomial (<= 2 ulp) with the range checks dropped; results below e**-87
    (~1.6e-38, far under any probability that matters) flush to 0, as do -inf and NaN."""
    xc = max(x, f32(-87.0))
    k = pk.floor(pk.fma(xc, f32(INV_LN2), f32(0.5)))   # -125 <= k <= 0: 2**k is normal
    r = pk.fma(-k, f32(LN2_HI), xc)
    r = pk.fma(-k, f32(LN2_LO), r)
    p = exp_poly(r) * pk.bitcast(u32(i32(k) + 127) << 23, f32)
    return p if x >= f32(-87.0) else f32(0.0)


@pk.func
def finite(v: f32) -> bool:
    """v is neither NaN nor +-Inf (NaN compares false both ways). The samplers' test of a
    row's largest logit: without a finite one there is nothing to draw from."""
    return v > f32(NEG_INF) and v < f32(-NEG_INF)
