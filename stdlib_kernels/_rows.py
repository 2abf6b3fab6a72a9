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
rows). GROUP > 32: one block per row, shuffles plus one shared-memory step.
Input: n (row length). Output: `RowGeometry` (or None when a row does not fit: callers fall
back to their looping kernels).
"""
from __future__ import annotations

from typing import NamedTuple

import pykernel as pk
from pykernel import Const, f32, i32

from ._device import block_max, block_sum, load4, warp_max, warp_sum

WARP_ROWS_PER_BLOCK = 4     # rows per 128-thread block when one warp handles a row
MAX_CHUNKS = 8              # units (4 elements) per thread: 32 f32 registers of row data
MAX_GROUP = 1024
REGISTER_ROW_LIMIT = MAX_GROUP * MAX_CHUNKS * 4    # longer rows use the looping kernels
# Below this many rows a row gets as many threads as it has units (up to 1024): at batch 1
# the H200 ran 64-256 threads x 8 units slower than 1024 threads x 1 unit (latency bound).
FEW_ROWS = 64


class RowGeometry(NamedTuple):
    group: int      # threads per row
    chunks: int     # units of 4 elements per thread
    grid: int
    block: int


def row_geometry(rows: int, n: int, max_chunks: int | None = None) -> RowGeometry | None:
    """Threads per row and units per thread for rows of n elements (None: too long).
    `max_chunks` (default MAX_CHUNKS) trades registers per thread for threads per row: more
    threads hide more latency where a kernel does more arithmetic per element."""
    max_chunks = MAX_CHUNKS if max_chunks is None else min(max_chunks, MAX_CHUNKS)
    if rows < FEW_ROWS:   # a few rows (decode): spread each over up to 1024 threads
        max_chunks = 1
    units = -(-n // 4)
    if n > REGISTER_ROW_LIMIT:
        return None
    if units <= 32 * max_chunks:
        rows_per_block = WARP_ROWS_PER_BLOCK if rows > 1 else 1
        return RowGeometry(32, -(-units // 32), -(-rows // rows_per_block), 32 * rows_per_block)
    group = 64
    while group * max_chunks < units and group < MAX_GROUP:
        group *= 2
    return RowGeometry(group, -(-units // group), rows, group)   # <= MAX_CHUNKS: n fits


@pk.func
def group_row(GROUP: Const[int]):
    """(row, lane) of this thread: a warp per row when GROUP == 32, else the block's row."""
    if GROUP == 32:
        return pk.block_idx.x * (pk.block_dim.x // 32) + pk.thread_idx.x // 32, pk.lane_id()
    else:
        return pk.block_idx.x, pk.thread_idx.x


@pk.func
def group_sum(v: f32, scratch, GROUP: Const[int]) -> f32:
    if GROUP == 32:
        return warp_sum(v)
    else:
        return block_sum(v, scratch)


@pk.func
def group_max(v: f32, scratch, GROUP: Const[int]) -> f32:
    if GROUP == 32:
        return warp_max(v)
    else:
        return block_max(v, scratch)


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
