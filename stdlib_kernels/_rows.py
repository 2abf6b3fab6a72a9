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
warp shuffles plus one shared-memory step over the row's own warps. Threads of a block past the
last row work on the last row and store nothing, so every thread reaches every barrier.
Launch bounds (`RowConfig.bounded`): max_threads = the block, min_blocks = the blocks each SM
must hold for the whole grid to be resident at once, so ptxas caps registers to allow it.
Input: rows, n (row length), a RowConfig. Output: `RowGeometry` (or None when a row does not
fit: callers fall back to their looping kernels).
"""
from __future__ import annotations

from typing import NamedTuple

import pykernel as pk
from pykernel import Const, f32, i32

from . import _launch as L
from ._device import NEG_INF, load4, warp_max, warp_sum

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

    def spec(self) -> tuple:
        """The kernels' geometry Const values: CHUNKS, GROUP, RPB (rows per block)."""
        return (("CHUNKS", self.chunks), ("GROUP", self.group),
                ("RPB", self.block // self.group))


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
    return RowGeometry(group, -(-units // group), grid, block,
                       one_wave_bounds(grid, block) if config.bounded else None)


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
def group_sum(v: f32, scratch, GROUP: Const[int]) -> f32:
    """Sum over the GROUP threads of this thread's row (every thread of the block calls it;
    `scratch` holds >= 32 f32). Starts with a barrier, so consecutive calls may share it."""
    v = warp_sum(v)
    if GROUP > 32:
        pk.syncthreads()
        if pk.lane_id() == 0:
            scratch[pk.thread_idx.x // 32] = v
        pk.syncthreads()
        part = f32(0.0)
        if pk.lane_id() < GROUP // 32:
            part = scratch[(pk.thread_idx.x // GROUP) * (GROUP // 32) + pk.lane_id()]
        v = warp_sum(part)
    return v


@pk.func
def group_max(v: f32, scratch, GROUP: Const[int]) -> f32:
    """Maximum over the GROUP threads of this thread's row (see group_sum)."""
    v = warp_max(v)
    if GROUP > 32:
        pk.syncthreads()
        if pk.lane_id() == 0:
            scratch[pk.thread_idx.x // 32] = v
        pk.syncthreads()
        part = f32(NEG_INF)
        if pk.lane_id() < GROUP // 32:
            part = scratch[(pk.thread_idx.x // GROUP) * (GROUP // 32) + pk.lane_id()]
        v = warp_max(part)
    return v


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
