"""Device functions of the persistent decode step's row items (decode.py): the RMS of x, one
value of an item's input (x, or normed), one weight row of any format the step reads dotted
with the input (F32 rows: x itself; quantized rows: its Q8_1 copy, which a QUANT item wrote
into the xq buffer), and one embedding value.

The quantized rows reuse stdlib quant's DP4A item dots (gemv_kernels.item_dot_q8, the register
GEMV's) on Q8_1 activations; a warp per row, lane l taking items l, l + 32, ... and the warp's
sum last: the GEMV's per-row order with one warp per row and one item per visit (KW = 1,
WIDEN = 1, the formats' base variants). The Q8_1 input is what the decode graph's kernels write:
rmsnorm_q8_1's sum of squares (its 16-warp order, replayed by 8 warps: graph_rstd), then x *
rstd * w (input_value) rounded by store_q8_1_block, whose bits q8_1.quantize_q8_1 also gives
for unnormed inputs.

Weights come as one byte buffer seen through four pointers (u8, u16, u32, f32 words) and row
byte offsets (int64: an 8B model's buffer passes 2^31 u16 words); a row's format is a runtime
value, so each format's dot is one branch of an `if` chain (decode_schedule.WEIGHT_FORMATS).
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64, u8, u16, u32

from .._device import warp_sum
from ..quant.dequant_kernels import dequantize_one
from ..quant.formats import F32, Q4_1, Q4_K, Q6_K, Q8_0
from ..quant.gemv_kernels import item_dot_q8
from ..quant.q8_1 import store_q8_1_block
from .chain import publish
from .decode_schedule import N_ITEMS, N_OUT, Q_NORM, Q_OUT, Y

NAN = float("nan")
GRAPH_WARPS = 16       # rmsnorm_q8_1.WARPS: the sum order the Q8_1 inputs replay


@pk.func
def graph_rstd(acts: Ptr[f32], x_off: i32, n: i32, eps: f32, scratch) -> f32:
    """Whole block of 8 warps: 1 / sqrt(mean(x^2) + eps) of acts[x_off:x_off + n] summed as
    rmsnorm_q8_1_kernel sums it with 16 warps: thread t plays its threads t and t + 256
    (lane t % 32, warps t / 32 and t / 32 + 8), 4-value vector steps when n % 4 == 0 (x_off is
    a multiple of 4), then each of the 16 warp sums, then the sum of those in one warp."""
    t = pk.thread_idx.x
    lane = t % 32
    vec = 4 if n % 4 == 0 else 1
    chunks = (n + 32 * GRAPH_WARPS * vec - 1) // (32 * GRAPH_WARPS * vec)
    for half in pk.static_range(2):
        ss = f32(0.0)
        for ch in range(chunks):
            c = (ch * (32 * GRAPH_WARPS) + t + 256 * half) * vec
            if c < n:
                if vec == 4:
                    a, b, d, e = pk.load_vec(acts, x_off + c, 4)
                    ss += a * a + b * b + d * d + e * e
                else:
                    v = acts[x_off + c]
                    ss += v * v
        ss = warp_sum(ss)
        if lane == 0:
            scratch[t // 32 + 8 * half] = ss
    pk.syncthreads()
    total = f32(0.0)
    if lane < GRAPH_WARPS:
        total = scratch[lane]
    total = warp_sum(total)
    pk.syncthreads()                 # the scratch is reused by the block's next reduction
    return 1.0 / pk.sqrt(total / f32(n) + eps)


@pk.func
def input_value(acts: Ptr[f32], x_off: i32, c: i32, wf: Ptr[f32, "ro"], norm: i64,
                rstd: f32) -> f32:
    """Value c of the item's input: x, or x * rstd * norm weights."""
    v = acts[x_off + c]
    if norm >= 0:
        v = v * rstd
        v = v * wf[(norm >> i64(2)) + i64(c)]
    return v


@pk.func
def f32_row_dot(wf: Ptr[f32, "ro"], off: i64, acts: Ptr[f32], x_off: i32, n_in: i32,
                norm: i64, rstd: f32, lane: i32) -> f32:
    """One warp: an F32 row (byte offset off) . the input, acts[x_off:] or its RMS norm."""
    acc = f32(0.0)
    row = off >> i64(2)
    j = lane
    if norm >= 0:
        nw = norm >> i64(2)
        while j < n_in:
            acc += wf[row + i64(j)] * (acts[x_off + j] * rstd * wf[nw + i64(j)])
            j += 32
    else:
        while j < n_in:
            acc += wf[row + i64(j)] * acts[x_off + j]
            j += 32
    return warp_sum(acc)


ROW_UNROLL = 4       # a lane's items per straight-line visit: their weight loads overlap


@pk.func
def q8_items(FMT: Const[int], w, nitems: i32, ITEMS: Const[int], xq, acc, lane: i32):
    """acc[0] += lane's items (lane, lane + 32, ...) of the row at w against xq, in that
    order; ROW_UNROLL of them a visit while that many remain (a long row, e.g. 14336 values
    of Q4_K: 14 items a lane, waited one memory round trip per item in a plain loop)."""
    it = lane
    while it + 32 * (ROW_UNROLL - 1) < nitems:
        for k in pk.static_range(ROW_UNROLL):
            item = it + 32 * k
            item_dot_q8(FMT, w, 0, item // ITEMS, item % ITEMS, xq, 0, acc, 0, 1)
        it += 32 * ROW_UNROLL
    while it < nitems:
        item_dot_q8(FMT, w, 0, it // ITEMS, it % ITEMS, xq, 0, acc, 0, 1)
        it += 32


@pk.func
def q8_row_dot(fmt: i32, w16: Ptr[u16, "ro"], w32: Ptr[u32, "ro"], off: i64, n_in: i32, xq,
               lane: i32) -> f32:
    """One warp: a quantized row (format fmt, byte offset off) . the Q8_1 input xq (global:
    a plain pointer, coherent loads, since a QUANT item wrote it in this launch)."""
    acc = pk.local_array(f32, 1)
    acc[0] = 0.0
    if fmt == Q8_0:           # 34-byte blocks: u16 words
        q8_items(Q8_0, w16 + (off >> i64(1)), n_in // 32, 1, xq, acc, lane)
    elif fmt == Q4_1:
        q8_items(Q4_1, w32 + (off >> i64(2)), n_in // 32, 1, xq, acc, lane)
    elif fmt == Q4_K:         # 8 items of 32 values per 256-value block
        q8_items(Q4_K, w32 + (off >> i64(2)), n_in // 256 * 8, 8, xq, acc, lane)
    elif fmt == Q6_K:         # 210-byte blocks: u16 words
        q8_items(Q6_K, w16 + (off >> i64(1)), n_in // 256 * 8, 8, xq, acc, lane)
    return warp_sum(acc[0])


@pk.func
def row_dot(fmt: i32, w16: Ptr[u16, "ro"], w32: Ptr[u32, "ro"], wf: Ptr[f32, "ro"], off: i64,
            acts: Ptr[f32], x_off: i32, n_in: i32, norm: i64, rstd: f32, xq, lane: i32) -> f32:
    if fmt == F32:
        return f32_row_dot(wf, off, acts, x_off, n_in, norm, rstd, lane)
    return q8_row_dot(fmt, w16, w32, off, n_in, xq, lane)


@pk.func
def arrive_on_group(counters: Ptr[u32], counter0: i32, g: i32, lo: i32, hi: i32,
                    n: i32) -> i32:
    """1 if this item (rows lo..hi) completes Q8_1 block g of an n-row output: it covers the
    whole block, or its acq_rel add of the rows it covers brings the block's arrival counter
    to the block's rows (then it resets the counter for the next layer and launch)."""
    start = max(lo, 32 * g)
    mine = min(hi, 32 * g + 32) - start
    size = min(32, n - 32 * g)
    last = 1
    if mine < size:
        old = pk.atomic_add(counters, counter0 + g, u32(mine), order="acq_rel")
        last = 1 if old + u32(mine) == u32(size) else 0
        if last != 0:
            pk.store_relaxed(counters, counter0 + g, u32(0))
    return last


@pk.func
def publish_q8_1_groups(acts: Ptr[f32], xq: Ptr[u32], counters: Ptr[u32], st: Ptr[i64, "ro"],
                        lo: i32, hi: i32, counter0: i32, edge):
    """After a GLU item's rows lo..hi: the Q8_1 blocks of the output (acts at st[Y]) that this
    item completes, into xq at st[Q_OUT] (quantize_q8_1's bits: store_q8_1_block). Blocks
    inside lo..hi are its own; the (at most two) blocks it shares with other items go to the
    last of them to arrive on the block's counter (counters[counter0 + block]), as the
    attention merge does per head: threads 0 and 1 arrive (release of the block's row stores,
    ordered by the barrier; acquire of the other items'), the barrier shares the outcome.
    Every block of the output is then written before its last item publishes, so the next
    stage's wait on the GLU stage covers them: no QUANT stage between."""
    t = pk.thread_idx.x
    n = i32(st[N_OUT])
    g0 = lo // 32
    g1 = (hi - 1) // 32
    pk.syncthreads()                 # the item's row stores before the arrivals' release
    if t < 2:
        last = 0
        if t == 0 or g1 != g0:
            last = arrive_on_group(counters, counter0, g0 + t * (g1 - g0), lo, hi, n)
        edge[t] = last
    pk.syncthreads()                 # the acquire in the arrival orders the blocks' reads
    lane = t % 32
    y_off = i32(st[Y])
    out = xq + i32(st[Q_OUT])
    g = g0 + t // 32
    while g <= g1:                   # warp-uniform
        if (g > g0 and g < g1) or (g == g0 and edge[0] != 0) or (g == g1 and edge[1] != 0):
            store_q8_1_block(acts[y_off + 32 * g + lane], lane, out, g)
        g += pk.block_dim.x // 32


@pk.func
def arrive_and_quantize(acts: Ptr[f32], wf: Ptr[f32, "ro"], xq: Ptr[u32], counters: Ptr[u32],
                        st: Ptr[i64, "ro"], counter: i32, eps: f32, scratch, flag):
    """An item of a stage writing x whose next matrix reads Q8_1(rmsnorm(x, st[Q_NORM])):
    the item's arrival on its stage counter is its publish (acq_rel: release of its rows,
    ordered by the barrier; acquire of the others'); the last of the stage's st[N_ITEMS] items
    to arrive then writes the whole input as the QUANT items did (graph_rstd, input_value,
    store_q8_1_block: rmsnorm_q8_1's bytes) and publishes once more, so the next stage waits
    for N_ITEMS + 1 arrivals on the one counter: one link where there were two."""
    t = pk.thread_idx.x
    pk.syncthreads()                 # the item's stores before the arrival's release
    if t == 0:
        old = pk.atomic_add(counters, counter, u32(1), order="acq_rel")
        flag[0] = 1 if old == u32(st[N_ITEMS] - i64(1)) else 0
    pk.syncthreads()                 # the acquire in the arrival orders the block's reads
    if flag[0] != 0:                 # block-uniform
        x_off = i32(st[Y])
        n = i32(st[N_OUT])
        norm = st[Q_NORM]
        rstd = graph_rstd(acts, x_off, n, eps, scratch)
        lane = t % 32
        out = xq + i32(st[Q_OUT])
        blk = t // 32
        while blk < n // 32:         # warp-uniform
            store_q8_1_block(input_value(acts, x_off, blk * 32 + lane, wf, norm, rstd), lane,
                             out, blk)
            blk += pk.block_dim.x // 32
        publish(counters, counter, t)


@pk.func
def embed_value(fmt: i32, w8: Ptr[u8, "ro"], wf: Ptr[f32, "ro"], row: i64, c: i32) -> f32:
    """Value c of the embedding row at byte offset row (stdlib quant's dequantize_one)."""
    v = f32(NAN)
    if fmt == F32:
        v = wf[(row >> i64(2)) + i64(c)]
    elif fmt == Q8_0:
        v = dequantize_one(w8 + row + i64((c // 32) * 34), c % 32, Q8_0)
    elif fmt == Q4_1:
        v = dequantize_one(w8 + row + i64((c // 32) * 20), c % 32, Q4_1)
    elif fmt == Q4_K:
        v = dequantize_one(w8 + row + i64((c // 256) * 144), c % 256, Q4_K)
    elif fmt == Q6_K:
        v = dequantize_one(w8 + row + i64((c // 256) * 210), c % 256, Q6_K)
    return v
