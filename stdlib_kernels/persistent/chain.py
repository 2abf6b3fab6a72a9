"""A persistent kernel that runs a chain of dependent GEMV stages (schedule.py) in one launch,
items waiting on counters in global memory instead of kernel boundaries.

    chain = ChainRunner(sched, weights_flat, act="relu")   # device buffers, once
    chain.run(x0) -> y_L (device array)                     # one launch, replayable
    chain.launch(stream)                                    # y_0 already in chain.acts

Input: the schedule's item / stage tables, the flat weights, y_0 at offset 0 of the activation
buffer. Output: every y_l (l >= 1) in the activation buffer, the counters back at zero.

Work assignment: a dynamic queue. Thread 0 of a block takes `ticket = atomic_add(counters[
TICKET], 1)` and runs item `ticket` until the tickets pass the item count. A ticket is only taken
by a block that is running, and the schedule orders every item after all the items it waits on
(schedule.validate), so the oldest unfinished item never waits on anything: no deadlock, for any
grid, co-resident or not (a static round-robin assignment can hand item k's producer to a block
that is not resident yet while block k spins, a deadlock unless the grid fits). The queue also
balances: a block that drew a short tile takes the next item sooner.

Memory ordering (PTX memory model; the CPU target gives LLVM atomics the same orders):
- Producer: every thread stores its rows of y_{l+1} (plain st.global), `syncthreads` (a CTA
  barrier: those stores are ordered before thread 0's next operation), then thread 0 does
  `atom.add.release.gpu` on the stage's counter. The release is cumulative: it publishes every
  write ordered before it, the other threads' stores included.
- Consumer: thread 0 polls the producer stage's counter with `ld.acquire.gpu` (nanosleep
  backoff) until it reads wait_count. The counter's increments are all read-modify-writes, so
  they form one release sequence: the value wait_count is written by the last of them and
  every earlier increment (each a release) happens before it; the acquire read therefore
  synchronizes with every producer tile. `syncthreads` then orders the whole block's loads of
  y_l after the acquire. The activation pointer is deliberately not "ro": `ld.global.nc` may be
  served from the non-coherent texture path and return y_l as it was before the producer wrote
  it; weights are read-only for the launch and stay "ro".
- Stage 0 reads y_0, written by the host before the launch: the launch boundary orders it, so
  stage 0 items wait on nothing (wait_counter = -1).
- Each y_l has its own buffer segment, written once per launch: no write-after-read hazard.
- Reset for replays: the counters start at zero and every launch leaves them at zero, so the
  same launch (a CUDA graph node with the same arguments) replays without a host write. After
  its last ticket, thread 0 of each block does `atom.add.acq_rel.gpu` on counters[EXITED]; the
  block that reads grid - 1 is the last one. Every other block's counter accesses came before
  its own EXITED increment, which the last block acquired, so nothing reads or bumps a counter
  after that point; it stores zero to the ticket and stage counters, then to EXITED, and the
  next launch sees them through the launch boundary. `ChainRunner.reset()` zeroes them from the
  host after a failed launch.
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32

from .schedule import EXITED, FIRST_STAGE_COUNTER, ITEM_COLS, NO_WAIT, STAGE_COLS, TICKET, \
    Schedule, validate

ACTIVATIONS = {"none": 0, "relu": 1, "tanh": 2}
WARPS = 8            # warps per block; each warp computes whole rows of a tile
BACKOFF_NS = 32      # first sleep of a wait, doubled up to MAX_BACKOFF_NS
MAX_BACKOFF_NS = 256  # a sleep of N ns between polls can add up to N to every link of a
                      # chain (a decode token: ~6 stages a layer), so the cap stays short


@pk.func
def apply_act(v: f32, ACT: Const[int]) -> f32:
    out = v
    if ACT == 1:
        if v < f32(0.0):             # not max(): that drops NaN, and poison must show
            out = f32(0.0)
    elif ACT == 2:
        out = pk.tanh(v)
    return out


@pk.func
def row_dot(w: Ptr[f32, "ro"], acts: Ptr[f32], w_row: i32, x_off: i32, n_in: i32,
            lane: i32) -> f32:
    """One warp's dot product of a weight row with y_l (all lanes get the sum). Rows and y_l
    start 16-byte aligned when n_in % 4 == 0 (schedule offsets are multiples of 4 floats)."""
    acc = f32(0.0)
    if n_in % 4 == 0:
        j = 4 * lane
        while j < n_in:
            a0, a1, a2, a3 = pk.load_vec(w, w_row + j, 4)
            b0, b1, b2, b3 = pk.load_vec(acts, x_off + j, 4)
            acc += a0 * b0 + a1 * b1 + a2 * b2 + a3 * b3
            j += 128
    else:
        j = lane
        while j < n_in:
            acc += w[w_row + j] * acts[x_off + j]
            j += 32
    for k in pk.static_range(5):
        acc += pk.shfl_xor(acc, 16 >> k)
    return acc


@pk.func
def next_item(counters: Ptr[u32], items: Ptr[i32, "ro"], n_items: i32, taken, t: i32) -> i32:
    """The block's next item, once its dependency is met (thread 0 takes the ticket and waits;
    the block reads it through `taken`, a 1-int shared array); n_items or more: none left."""
    if t == 0:
        ticket = i32(pk.atomic_add(counters, TICKET, u32(1), order="relaxed"))
        if ticket < n_items:
            wait_for(counters, items[ticket * ITEM_COLS + 3], items[ticket * ITEM_COLS + 4])
        taken[0] = ticket
    pk.syncthreads()                 # the acquire in wait_for orders the block's reads
    item = taken[0]
    pk.syncthreads()                 # all have read it before thread 0 takes the next
    return item


@pk.func
def publish(counters: Ptr[u32], counter: i32, t: i32):
    """The item's stores by every thread of the block, then thread 0's release increment of
    the item's completion counter (what a consumer's acquire in wait_for pairs with)."""
    pk.syncthreads()
    if t == 0:
        pk.atomic_add(counters, counter, u32(1), order="release")


@pk.func
def exit_block(counters: Ptr[u32], n_stages: i32, t: i32):
    """Count the block out; the last block out (every other is done with the counters) resets
    the ticket, the stage counters and the exit count, so the same launch replays."""
    if t == 0:
        last = pk.atomic_add(counters, EXITED, u32(1), order="acq_rel") == \
            u32(pk.grid_dim.x - 1)
        if last:
            pk.store_relaxed(counters, TICKET, u32(0))
            for s in range(n_stages):
                pk.store_relaxed(counters, FIRST_STAGE_COUNTER + s, u32(0))
            pk.store_relaxed(counters, EXITED, u32(0))


@pk.func
def wait_for(counters: Ptr[u32], counter: i32, needed: i32):
    """Thread 0: spin (acquire loads, growing nanosleep) until counters[counter] >= needed."""
    if counter != NO_WAIT:
        sleep = BACKOFF_NS
        while pk.load_acquire(counters, counter) < u32(needed):
            pk.nanosleep(sleep)
            if sleep < MAX_BACKOFF_NS:
                sleep = sleep * 2


@pk.kernel
def chain_kernel(w: Ptr[f32, "ro"], acts: Ptr[f32], items: Ptr[i32, "ro"],
                 stages: Ptr[i32, "ro"], counters: Ptr[u32], n_items: i32, n_stages: i32,
                 ACT: Const[int]):
    t = pk.thread_idx.x
    lane = t % 32
    warp = t // 32
    warps = pk.block_dim.x // 32
    taken = pk.shared_array(i32, 1)
    while True:
        item = next_item(counters, items, n_items, taken, t)
        if item >= n_items:
            break
        stage = items[item * ITEM_COLS]
        w_off = stages[stage * STAGE_COLS]
        x_off = stages[stage * STAGE_COLS + 1]
        y_off = stages[stage * STAGE_COLS + 2]
        n_in = stages[stage * STAGE_COLS + 3]
        row = items[item * ITEM_COLS + 1] + warp
        hi = items[item * ITEM_COLS + 2]
        while row < hi:
            acc = row_dot(w, acts, w_off + row * n_in, x_off, n_in, lane)
            if lane == 0:
                acts[y_off + row] = apply_act(acc, ACT)
            row += warps
        publish(counters, items[item * ITEM_COLS + 5], t)
    exit_block(counters, n_stages, t)


def device_tables(sched) -> tuple:
    """A schedule's item and stage tables (flat, on the device) and its zeroed counters."""
    return (pk.to_device(np.ascontiguousarray(sched.items.reshape(-1))),
            pk.to_device(np.ascontiguousarray(sched.stages.reshape(-1))),
            pk.zeros(sched.counters, np.uint32))


def launch_grid(who: str, grid, kernel, block: int, **consts) -> int:
    """`grid`, or the kernel's co-resident grid (every block resident at once: a waiting
    block never holds a multiprocessor that the item it waits on needs)."""
    grid = grid or kernel.co_resident_grid(block, **consts)
    if grid < 1:
        raise ValueError(f"{who}: grid must be positive, got {grid}")
    return grid


class ChainRunner:
    """Device buffers for one schedule: weights, activations, tables, counters; `launch` runs
    the whole chain in one launch of `grid` blocks (default: the co-resident grid)."""

    def __init__(self, sched: Schedule, weights_flat, act: str = "relu", grid: int | None = None,
                 check: bool = True):
        if act not in ACTIVATIONS:
            raise ValueError(f"ChainRunner: act must be one of {sorted(ACTIVATIONS)}, got "
                             f"{act!r}")
        if check:
            validate(sched)
        if weights_flat.dtype != np.float32 or weights_flat.size != sched.weight_elems:
            raise ValueError(f"ChainRunner: weights must be float32 with {sched.weight_elems} "
                             f"elements (schedule.pack_weights), got {weights_flat.dtype} "
                             f"{tuple(weights_flat.shape)}")
        self.sched, self.act = sched, ACTIVATIONS[act]
        self.weights = pk.to_device(weights_flat) if isinstance(weights_flat, np.ndarray) \
            else weights_flat
        self.acts = pk.full(sched.act_elems, np.nan, np.float32)   # unwritten rows show
        self.items, self.stages, self.counters = device_tables(sched)
        self.block = WARPS * 32
        self.grid = launch_grid("ChainRunner", grid, chain_kernel, self.block, ACT=self.act)

    def reset(self) -> None:
        """Zero the counters from the host (only needed after a launch that failed)."""
        self.counters.fill(0)

    def launch(self, stream=None) -> None:
        chain_kernel[self.grid, self.block, stream](
            self.weights, self.acts, self.items, self.stages, self.counters,
            self.sched.n_items, self.sched.n_stages, self.act)

    def set_input(self, x0) -> None:
        x0 = np.asarray(x0, np.float32)
        if x0.shape != (self.sched.dims[0],):
            raise ValueError(f"ChainRunner: input must be ({self.sched.dims[0]},), got "
                             f"{x0.shape}")
        acts = self.acts.numpy()
        acts[:x0.size] = x0
        self.acts.copy_from(acts)

    def output(self, layer: int | None = None) -> np.ndarray:
        """y_layer (default y_L) as numpy."""
        layer = self.sched.n_stages if layer is None else layer
        off = self.sched.act_offset(layer)
        return self.acts.numpy()[off:off + self.sched.dims[layer]]

    def run(self, x0) -> np.ndarray:
        self.set_input(x0)
        self.launch()
        return self.output()
