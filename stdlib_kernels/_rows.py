"""Row kernels that keep their row in registers: geometry choice and the device helpers.

A row of n elements is read once, in "units" of 4 elements (one 16-byte f32 vector load when
aligned), by a group of GROUP threads: unit j of a thread is j * GROUP + lane, so every pass
over j is one coalesced access across the group. Each thread keeps its CHUNKS units in a
`pk.local_array` indexed by compile-time constants (promoted to registers), reduces, then
writes from registers: one read of x instead of two or three.

Loads are unconditional (`load_unit`): a unit past the row's end re-reads the row's last unit
and is zeroed by a select, so a thread issues all its loads before using any. Loads guarded by
`if c < n` compiled to one branch per unit, each waiting for its load before the next was
issued: CHUNKS memory latencies in a row instead of one.

GROUP == 32: one warp per row, several rows per block, warp-shuffle reductions only (short
rows). GROUP > 32: `rows_per_block` rows of GROUP threads each per block; a row's reduction is
warp shuffles, one barrier, then a butterfly over only the row's GROUP / 32 warp partials
(every lane reads partial lane % parts, so each aligned set of `parts` lanes ends with the
total: log2(parts) shuffles instead of 5). Reductions take their own scratch array and no
leading barrier (a kernel with two reductions uses two arrays: one barrier each, not two).
`group_max_sum` reduces (max, sum of exp) pairs in one pass (softmax); `group_mean_m2` reduces
(count, mean, sum of squared deviations) triples, Chan's parallel variance (layernorm).
Threads of a block past the last row work on the last row and store nothing, so every thread
reaches every barrier.
Launch bounds (`RowConfig.bounded`): max_threads = the block, min_blocks = the blocks each SM
must hold for the whole grid to be resident at once, so ptxas caps registers to allow it.
`RowConfig.trigger`: kernels whose grid is known to be one resident wave (bounded, or fewer
blocks than SMs) call `pk.launch_dependents()` at entry (TRIGGER), so in a PDL graph the next
kernel launches while this one runs. Measured slower for every one-wave row kernel at batch
512 on the H200 (0.1-0.9 us, benchmarks/RESULTS.md), so no default table sets it.
`RowConfig.one_pass` (softmax, layernorm): one merged reduction instead of two; each merge step
carries an exp (softmax) or a division (layernorm) on the shuffle chain, which cost more than
the barrier it saves except for layernorm at 512 x 8192; never used below FEW_ROWS rows.
Input: rows, n (row length), a RowConfig. Output: `RowGeometry` (or None when a row does not
fit: callers fall back to their looping kernels).
"""
from __future__ import annotations

from typing import NamedTuple

import pykernel as pk
from pykernel import Const, f32, i32

from . import _launch as L
from ._device import exp_nonpositive, load4
from .collectives import MAX, SUM, group_reduce, warp_reduce

WARP_ROWS_PER_BLOCK = 4     # rows per 128-thread block when one warp handles a row
MAX_CHUNKS = 16             # units (4 elements) per thread: 64 f32 registers of row data
MAX_GROUP = 1024
# blocks of several rows stay within 256 threads: launchable at any register count (<= 255)
MAX_SHARED_BLOCK = 256
REGISTER_ROW_LIMIT = MAX_GROUP * 8 * 4    # longer rows use the looping kernels
# Below this many rows a row gets as many threads as it has units (up to 1024): at batch 1
# the H200 ran 64-256 threads x 8 units slower than 1024 threads x 1 unit (latency bound).
FEW_ROWS = 64
THREADS_PER_SM = 2048       # sm_80..sm_90 resident-thread limit
BLOCKS_PER_SM = 32


class RowConfig(NamedTuple):
    chunks: int = 4           # at most this many units per thread (more threads per row below)
    rows_per_block: int = 1   # rows sharing a block when a row takes more than a warp
    bounded: bool = False     # launch bounds that make the whole grid one resident wave
    weight_early: bool = False   # norms: load weight/bias with x (else after the reduction)
    one_pass: bool = False    # softmax/layernorm: one reduction of pairs/triples (else two)
    trigger: bool = False     # launch_dependents at entry when the grid is one wave


def config_for(table, n: int) -> RowConfig:
    """The RowConfig of `table` ((max_n, RowConfig) pairs, ascending) for rows of n."""
    for max_n, config in table:
        if n <= max_n:
            return config
    return table[-1][1]


class RowGeometry(NamedTuple):
    group: int      # threads per row
    chunks: int     # units of 4 elements per thread
    grid: int
    block: int
    bounds: tuple[int, int] | None   # (max_threads, min_blocks) for _launch.launch
    trigger: bool = False            # one resident wave and RowConfig.trigger

    def spec(self) -> tuple:
        """The kernels' geometry Const values: CHUNKS, GROUP, RPB (rows per block), TRIGGER."""
        return (("CHUNKS", self.chunks), ("GROUP", self.group),
                ("RPB", self.block // self.group), ("TRIGGER", self.trigger))


def row_geometry(rows: int, n: int, config: RowConfig = RowConfig()) -> RowGeometry | None:
    """Threads per row, units per thread and blocks for rows of n elements (None: too long).
    Fewer chunks trade registers per thread for threads per row: more threads hide more
    latency where a kernel does more arithmetic per element."""
    max_chunks = min(config.chunks, MAX_CHUNKS)
    rows_per_block = config.rows_per_block
    if rows < FEW_ROWS:   # a few rows (decode): spread each over up to 1024 threads
        max_chunks, rows_per_block = 1, 1
    units = -(-n // 4)
    if n > REGISTER_ROW_LIMIT:
        return None
    if units <= 32 * max_chunks:
        group = 32
        rows_per_block = WARP_ROWS_PER_BLOCK if rows > 1 else 1
    else:
        group = 64
        while group * max_chunks < units and group < MAX_GROUP:
            group *= 2
        rows_per_block = max(1, min(rows_per_block, MAX_SHARED_BLOCK // group))
    grid = -(-rows // rows_per_block)
    block = group * rows_per_block
    bounds = one_wave_bounds(grid, block) if config.bounded else None
    one_wave = bounds is not None or grid <= L.multiprocessors()
    return RowGeometry(group, -(-units // group), grid, block, bounds,
                       config.trigger and one_wave)


def one_pass(config: RowConfig, rows: int) -> bool:
    """Whether to merge the two reductions: only in the multi-unit layouts (>= FEW_ROWS rows);
    at batch 1 (up to 1024 threads, 10 merge steps) one pass measured 0.7-0.8 us slower."""
    return config.one_pass and rows >= FEW_ROWS


def one_wave_bounds(grid: int, block: int) -> tuple[int, int] | None:
    """(block, blocks per SM) when that many blocks can be resident on every SM, else None."""
    per_sm = -(-grid // L.multiprocessors())
    if per_sm * block > THREADS_PER_SM or per_sm > BLOCKS_PER_SM:
        return None
    return block, per_sm


@pk.func
def group_row(rows: i32, GROUP: Const[int], RPB: Const[int]):
    """(row, lane, live) of this thread: GROUP threads per row, RPB rows per block. Past the
    last row `row` is the last row and `live` False (it loads and reduces, stores nothing)."""
    if RPB == 1:   # grid == rows: every thread is live, no index arithmetic
        return pk.block_idx.x, pk.thread_idx.x, True
    else:
        row = pk.block_idx.x * RPB + pk.thread_idx.x // GROUP
        return min(row, rows - 1), pk.thread_idx.x % GROUP, row < rows


@pk.func
def partial_index(GROUP: Const[int]) -> i32:
    """Scratch slot this lane reads in a reduction's second stage: partial lane % parts of its
    row's parts = GROUP / 32 warp partials (every lane reads a valid one)."""
    return (pk.thread_idx.x // GROUP) * (GROUP // 32) + pk.lane_id() % (GROUP // 32)


@pk.func
def group_sum(v: f32, scratch, GROUP: Const[int]) -> f32:
    """Sum over the GROUP threads of this thread's row. Every thread of the block calls it;
    `scratch` (>= 32 f32) belongs to this reduction alone: there is no leading barrier."""
    v = warp_reduce(v, SUM)
    if GROUP > 32:
        if pk.lane_id() == 0:
            scratch[pk.thread_idx.x // 32] = v
        pk.syncthreads()
        v = group_reduce(scratch[partial_index(GROUP)], SUM, GROUP // 32)
    return v


@pk.func
def group_max(v: f32, scratch, GROUP: Const[int]) -> f32:
    """Maximum over the GROUP threads of this thread's row (see group_sum)."""
    v = warp_reduce(v, MAX)
    if GROUP > 32:
        if pk.lane_id() == 0:
            scratch[pk.thread_idx.x // 32] = v
        pk.syncthreads()
        v = group_reduce(scratch[partial_index(GROUP)], MAX, GROUP // 32)
    return v


@pk.func
def merge_max_sum(m: f32, s: f32, m2: f32, s2: f32):
    """(max, sum of exp(x - max)) of the union of two sets given as such pairs: the smaller
    max's sum is rescaled by exp(lo - hi) <= 1. Two empty (all -inf) sets give -inf - -inf =
    NaN, which exp_nonpositive flushes to 0. Symmetric: both lanes of a shuffle agree."""
    hi = max(m, m2)
    keep = s if m >= m2 else s2
    scaled = s2 if m >= m2 else s
    return hi, keep + scaled * exp_nonpositive(min(m, m2) - hi)


@pk.func
def butterfly_max_sum(m: f32, s: f32, WIDTH: Const[int]):
    for k in pk.static_range(5):
        if (16 >> k) < WIDTH:
            m, s = merge_max_sum(m, s, pk.shfl_xor(m, 16 >> k), pk.shfl_xor(s, 16 >> k))
    return m, s


@pk.func
def group_max_sum(m: f32, s: f32, scratch, GROUP: Const[int]):
    """(row max, row sum of exp(x - row max)) from each thread's (max, sum of exp(x - max))
    in one reduction; `scratch` holds >= 64 f32 (see group_sum)."""
    m, s = butterfly_max_sum(m, s, 32)
    if GROUP > 32:
        if pk.lane_id() == 0:
            scratch[pk.thread_idx.x // 32] = m
            scratch[32 + pk.thread_idx.x // 32] = s
        pk.syncthreads()
        slot = partial_index(GROUP)
        m, s = butterfly_max_sum(scratch[slot], scratch[32 + slot], GROUP // 32)
    return m, s


@pk.func
def merge_mean_m2(c: f32, mean: f32, q: f32, c2: f32, mean2: f32, q2: f32):
    """(count, mean, sum of squared deviations) of the union of two sets (Chan et al.): no
    sum-of-squares cancellation. Written symmetrically so both lanes of a shuffle agree."""
    total = c + c2
    inv = 1.0 / total if total > 0.0 else f32(0.0)
    delta = mean2 - mean
    return total, (c * mean + c2 * mean2) * inv, (q + q2) + delta * delta * (c * c2 * inv)


@pk.func
def butterfly_mean_m2(c: f32, mean: f32, q: f32, WIDTH: Const[int]):
    for k in pk.static_range(5):
        if (16 >> k) < WIDTH:
            c, mean, q = merge_mean_m2(c, mean, q, pk.shfl_xor(c, 16 >> k),
                                       pk.shfl_xor(mean, 16 >> k), pk.shfl_xor(q, 16 >> k))
    return c, mean, q


@pk.func
def group_mean_m2(c: f32, mean: f32, q: f32, scratch, GROUP: Const[int]):
    """(row mean, row sum of squared deviations) from each thread's (count, mean, sum of
    squared deviations) in one reduction; `scratch` holds >= 96 f32 (see group_sum)."""
    c, mean, q = butterfly_mean_m2(c, mean, q, 32)
    if GROUP > 32:
        if pk.lane_id() == 0:
            scratch[pk.thread_idx.x // 32] = c
            scratch[32 + pk.thread_idx.x // 32] = mean
            scratch[64 + pk.thread_idx.x // 32] = q
        pk.syncthreads()
        slot = partial_index(GROUP)
        c, mean, q = butterfly_mean_m2(scratch[slot], scratch[32 + slot], scratch[64 + slot],
                                       GROUP // 32)
    return mean, q


@pk.func
def unit_start(j: i32, lane: i32, GROUP: Const[int]) -> i32:
    """First element of this thread's unit j."""
    return (j * GROUP + lane) * 4


@pk.func
def load_unit(p, c: i32, n: i32, VEC: Const[int]):
    """Elements c..c+3 of row `p` as f32, zeros past n. VEC == 4 (n a multiple of 4): one vector
    load from min(c, n - 4), never inside a branch, so the compiler can issue every unit's load
    back to back. Otherwise load4's bounds-checked scalar loads (the unaligned fallback)."""
    if VEC == 4:
        a, b, d, e = pk.load_vec(p, min(c, n - 4), 4)
        live = c < n
        return (f32(a) if live else f32(0.0), f32(b) if live else f32(0.0),
                f32(d) if live else f32(0.0), f32(e) if live else f32(0.0))
    else:
        return load4(p, c, n, VEC)
