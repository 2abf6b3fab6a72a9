"""How a block of the persistent decode step (decode.py) takes its next item: the ticket, an L2
prefetch of the item's weight rows issued *before* the dependency wait, the wait itself
(chain.wait_for), and, in the profiling build only, globaltimer stamps per item.

Why the prefetch: every GEMV / GLU item's weights are known when its ticket is drawn, and the
queue runs ahead of the chain (a block draws a ticket of a later stage as soon as it is free),
so a tile's rows stream from HBM into L2 while its block still waits for the stage before;
after the wait the row loads hit L2. One `cp.async.bulk.prefetch.L2` per row range (thread 0,
one instruction, no barrier), so it costs the waiting block nothing. PREFETCH is a Const
because the instruction is sm_90+ (the runner passes False on older GPUs).

Profile (PROFILE=True, decode_runner's `profile=True`; the default build has none of it):
prof (n_items, PROF_COLS) u64 globaltimer nanoseconds per item, written by thread 0:
TAKEN (ticket drawn, before the wait), READY (the wait is over), PREPPED (GEMV / GLU: the
norm and Q8_1 input are ready; other kinds: READY), DONE (published). decode_profile.py turns
them into time per item kind.
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, i32, i64, u8, u32, u64

from .chain import wait_for
from .decode_schedule import (
    GEMV,
    GLU,
    KIND,
    N_OUT,
    ROW_BYTES,
    ROW_BYTES_B,
    SPLIT,
    STAGE_COLS,
    W_B,
    W,
)
from .schedule import ITEM_COLS, TICKET

PROF_COLS = 4
TAKEN, READY, PREPPED, DONE = range(PROF_COLS)
PREFETCH_ALIGN = 16      # cp.async.bulk: 16-byte aligned address, a multiple of 16 bytes


@pk.func
def stamp(prof: Ptr[u64], item: i32, col: i32, PROFILE: Const[bool]):
    """Thread 0, profiling build: prof[item, col] = globaltimer (nothing otherwise)."""
    if PROFILE:
        if pk.thread_idx.x == 0:
            prof[i64(item) * i64(PROF_COLS) + i64(col)] = pk.globaltimer()


@pk.func
def prefetch_range(w8: Ptr[u8, "ro"], base: i64, row_bytes: i64, r0: i64, r1: i64):
    """Rows r0..r1 of the row group at byte base into L2. Groups start 16-byte aligned and
    occupy a multiple of 16 bytes (decode_schedule.BYTE_ALIGN), so the range rounded out to
    16 bytes stays inside the group."""
    if r1 > r0:
        start = (base + r0 * row_bytes) & i64(-PREFETCH_ALIGN)
        end = (base + r1 * row_bytes + i64(PREFETCH_ALIGN - 1)) & i64(-PREFETCH_ALIGN)
        pk.bulk_prefetch_l2(w8, start, u32(end - start))


@pk.func
def prefetch_rows(w8: Ptr[u8, "ro"], st: Ptr[i64, "ro"], lo: i64, hi: i64):
    """Matrix rows lo..hi (groups A below SPLIT, B from SPLIT on) into L2."""
    split = st[SPLIT]
    prefetch_range(w8, st[W], st[ROW_BYTES], lo, min(hi, split))
    prefetch_range(w8, st[W_B], st[ROW_BYTES_B], max(lo, split) - split, hi - split)


@pk.func
def prefetch_item(w8: Ptr[u8, "ro"], st: Ptr[i64, "ro"], lo: i32, hi: i32):
    """The weight rows a GEMV item (rows lo..hi) or a GLU item (gate rows lo..hi and up rows
    n_ff + lo..n_ff + hi) will read."""
    kind = i32(st[KIND])
    if kind == GEMV or kind == GLU:
        prefetch_rows(w8, st, i64(lo), i64(hi))
        if kind == GLU:
            prefetch_rows(w8, st, i64(lo) + st[N_OUT], i64(hi) + st[N_OUT])


@pk.func
def take_item(w8: Ptr[u8, "ro"], counters: Ptr[u32], items: Ptr[i32, "ro"],
              stages: Ptr[i64, "ro"], n_items: i32, taken, t: i32, prof: Ptr[u64],
              PREFETCH: Const[bool], PROFILE: Const[bool]) -> i32:
    """chain.next_item with the item's weights prefetched before its wait: the block's next
    item once its dependency is met; n_items or more: none left."""
    if t == 0:
        ticket = i32(pk.atomic_add(counters, TICKET, u32(1), order="relaxed"))
        if ticket < n_items:
            stamp(prof, ticket, TAKEN, PROFILE)
            row = ticket * ITEM_COLS
            if PREFETCH:
                prefetch_item(w8, stages + items[row] * STAGE_COLS, items[row + 1],
                              items[row + 2])
            wait_for(counters, items[row + 3], items[row + 4])
            stamp(prof, ticket, READY, PROFILE)
            stamp(prof, ticket, PREPPED, PROFILE)     # GEMV / GLU items overwrite it
        taken[0] = ticket
    pk.syncthreads()                 # the acquire in wait_for orders the block's reads
    item = taken[0]
    pk.syncthreads()                 # all have read it before thread 0 takes the next
    return item
