"""Combining the split partials of decode attention (flash-decoding's second step).

Input: per (row, split) the unnormalised sum part_o (n_rows, n_splits, D) f32 and its running
max and denominator part_ml (n_rows, n_splits, 2) (log2 domain), n_splits <= MAXS.
Output: out[row] = sum_s o_s 2^(m_s - M) / (sum_s l_s 2^(m_s - M) [+ 2^(sink_h - M)]),
M = max_s m_s; with SINK, head h's learned sink logit (sinks[h] * log2(e), no value) joins the
denominator here, once, not per split (gpt-oss).

Done in parallel by a whole block, either the separate `combine_splits` kernel (one block per
row) or the last split block of a head group (decode_partial with FUSED, ROWS = its heads):
1. one warp per row loads every split's (m, l) at once (MAXS / 32 per lane, clamped, never
   behind a branch), reduces M and the denominator with shuffles and leaves the weights
   2^(m_s - M) in shared memory;
2. threads (split group sg, row, 4-float chunk) sum their splits s = sg, sg + SG, ... with
   UNR independent 16-byte loads in flight, and the SG group sums meet in shared memory.
The old form (each thread looping over every split twice, one dependent load per step) was a
serial chain of L2 round trips: the reason the one-launch variant used to lose.
"""
import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32

from .._device import warp_max, warp_sum
from ..quant.q8_1 import store_q8_1_block

NEG_INIT = -1.0e30   # running max before any key: finite, so exp2(m_old - m_new) is never NaN
MASKED = -3.0e38     # score of an invisible key / max of a missing split: exp2(MASKED - m) == 0
MAX_SPLITS = 256     # MAXS: split weights kept in shared memory per combined row
COMBINE_UNROLL = 8   # UNR: partial loads in flight per thread
LOG2E = 1.4426950408889634


@pk.func
def with_sink(den: f32, m_all: f32, sinks, head: i32, SINK: Const[int]) -> f32:
    """A normalising denominator (relative to the running max m_all, log2 domain) with head's
    sink logit added when SINK: the one place a sink enters a decode / prefill softmax."""
    if SINK:
        return den + pk.fast.exp2(sinks[head] * LOG2E - m_all)
    return den


@pk.func
def split_weights(part_ml, row: i32, n_splits: i32, sm_w, w0: i32, sinks, head: i32,
                  MAXS: Const[int], SINK: Const[int]) -> f32:
    """Whole warp: sm_w[w0 + s] = 2^(m_s - M) for s < n_splits; returns sum_s l_s 2^(m_s - M)
    (with SINK: + 2^(sink - M)) on every lane."""
    lane = pk.lane_id()
    ms = pk.local_array(f32, MAXS // 32)
    ls = pk.local_array(f32, MAXS // 32)
    m_max = f32(NEG_INIT)
    for i in pk.static_range(MAXS // 32):
        s = lane + 32 * i
        m_s, l_s = pk.load_vec(part_ml, (row * n_splits + min(s, n_splits - 1)) * 2, 2)
        ms[i] = m_s if s < n_splits else MASKED
        ls[i] = l_s
        m_max = max(m_max, ms[i])
    m_all = warp_max(m_max)
    den = f32(0.0)
    for i in pk.static_range(MAXS // 32):
        s = lane + 32 * i
        weight = pk.fast.exp2(ms[i] - m_all)
        if s < n_splits:
            sm_w[w0 + s] = weight
        den = pk.fma(ls[i], weight, den)
    return with_sink(warp_sum(den), m_all, sinks, head, SINK)


@pk.func
def combine_rows(part_o, part_ml, out, row0: i32, n_splits: i32, sm_w, sm_den, sm_red,
                 sinks, head0: i32, ROWS: Const[int], D: Const[int], NWARPS: Const[int],
                 SG: Const[int], TPG: Const[int], MAXS: Const[int], UNR: Const[int],
                 SINK: Const[int]):
    """Rows row0 .. row0 + ROWS - 1 of out (heads head0 .. head0 + ROWS - 1: their sinks with
    SINK), by every thread of the block (it synchronises).
    sm_w: ROWS * MAXS f32, sm_den: ROWS f32, sm_red: NWARPS * 32 * 4 f32 (shared).
    TPG threads per split group (TPG * SG <= threads; the rest only take part in barriers).
    part_o/part_ml may come from other blocks of the same launch: plain (coherent) loads.
    Each thread's first UNR partials are loaded before the split weights are computed, so
    the two L2 round trips overlap (one, when every split fits in that first batch)."""
    t = pk.thread_idx.x
    warp = t // 32
    sg = t // TPG
    g_lane = t % TPG
    limit = n_splits if sg < SG else 0
    items = ROWS * (D // 4)
    first = pk.local_array(f32, UNR * 4)
    item = min(g_lane, items - 1)
    for i in pk.static_range(UNR):
        s_in = min(sg + SG * i, n_splits - 1)
        x0, x1, x2, x3 = pk.load_vec(
            part_o, ((row0 + item // (D // 4)) * n_splits + s_in) * D + (item % (D // 4)) * 4, 4)
        first[i * 4] = x0
        first[i * 4 + 1] = x1
        first[i * 4 + 2] = x2
        first[i * 4 + 3] = x3
    for r in range(warp, ROWS, NWARPS):
        den = split_weights(part_ml, row0 + r, n_splits, sm_w, r * MAXS, sinks, head0 + r,
                            MAXS, SINK)
        if pk.lane_id() == 0:
            sm_den[r] = den
    pk.syncthreads()
    for item0 in range(0, items, TPG):
        item = min(item0 + g_lane, items - 1)
        r = item // (D // 4)
        col = (item % (D // 4)) * 4
        head_row = row0 + r
        a0 = f32(0.0)
        a1 = f32(0.0)
        a2 = f32(0.0)
        a3 = f32(0.0)
        for s0 in range(sg, limit, SG * UNR):
            for i in pk.static_range(UNR):
                s = s0 + SG * i
                s_in = min(s, n_splits - 1)
                if item0 == 0 and s0 == sg:
                    x0 = first[i * 4]
                    x1 = first[i * 4 + 1]
                    x2 = first[i * 4 + 2]
                    x3 = first[i * 4 + 3]
                else:
                    x0, x1, x2, x3 = pk.load_vec(part_o, (head_row * n_splits + s_in) * D + col,
                                                 4)
                weight = sm_w[r * MAXS + s_in] if s < n_splits else f32(0.0)
                a0 = pk.fma(weight, x0, a0)
                a1 = pk.fma(weight, x1, a1)
                a2 = pk.fma(weight, x2, a2)
                a3 = pk.fma(weight, x3, a3)
        live = item0 + g_lane < items and sg == 0
        if SG > 1:
            pk.store_vec(sm_red, t * 4, (a0, a1, a2, a3))
            pk.syncthreads()
            if live:
                for g in pk.static_range(1, SG):
                    b0, b1, b2, b3 = pk.load_vec(sm_red, (g * TPG + g_lane) * 4, 4)
                    a0 += b0
                    a1 += b1
                    a2 += b2
                    a3 += b3
            pk.syncthreads()
        if live:
            inv = 1.0 / sm_den[r]
            pk.store_vec(out, head_row * D + col, (a0 * inv, a1 * inv, a2 * inv, a3 * inv))


@pk.kernel
def combine_splits(part_o: Ptr[f32], part_ml: Ptr[f32], out: Ptr[f32], xq: Ptr[u32],
                   n_splits: i32, D: Const[int], NWARPS: Const[int], SG: Const[int],
                   TPG: Const[int], MAXS: Const[int], UNR: Const[int], TRIGGER: Const[int],
                   Q8OUT: Const[int], sinks: Ptr[f32, "ro"], n_head: i32, SINK: Const[int]):
    """Two-launch variant (a workspace without counters): one block per (z, head) row.
    TRIGGER (one wave): the next kernel of a PDL graph may launch at once. Q8OUT: the row is
    also written as Q8_1 into xq (its D / 32 blocks, block (z * n_head + head) * D / 32 + j:
    the bytes quantize_q8_1_into gives for out), the input of a Q8_1 GEMV with no quantize
    launch of its own. SINK: row z * n_head + h adds sinks[h] (n_head: unused without it)."""
    if TRIGGER:
        pk.launch_dependents()
    sm_w = pk.shared_array(f32, MAXS)
    sm_den = pk.shared_array(f32, 1)
    sm_red = pk.shared_array(f32, NWARPS * 32 * 4)
    row = pk.block_idx.x
    combine_rows(part_o, part_ml, out, row, n_splits, sm_w, sm_den, sm_red, sinks,
                 row % n_head if SINK else 0, 1, D, NWARPS, SG, TPG, MAXS, UNR, SINK)
    if Q8OUT:
        store_q8_1_rows(out, xq, row, 1, D, NWARPS)


@pk.func
def store_q8_1_rows(out, xq, row0: i32, ROWS: Const[int], D: Const[int], NWARPS: Const[int]):
    """Whole block, after it wrote rows row0 .. row0 + ROWS - 1 of out (D values each, D % 32
    == 0): the same rows as Q8_1 into xq (block r * D / 32 + j of row r), one warp per block,
    the bytes quantize_q8_1_into gives."""
    pk.syncthreads()                         # the rows are in `out` (this block's writes)
    lane = pk.lane_id()
    for i in range(pk.thread_idx.x // 32, ROWS * (D // 32), NWARPS):
        r = row0 + i // (D // 32)
        j = i % (D // 32)
        store_q8_1_block(out[r * D + 32 * j + lane], lane, xq, r * (D // 32) + j)


def combine_geometry(rows: int, head_dim: int, threads: int) -> dict:
    """SG split groups of TPG threads: one thread per (row, 4-float chunk) while they fit,
    the remaining threads splitting the split range further."""
    items = rows * (head_dim // 4)
    tpg = min(items, threads)
    return dict(SG=threads // tpg, TPG=tpg)
