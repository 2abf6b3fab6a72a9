"""Host side of the persistent chain: a chain of GEMV stages cut into row-tile work items, with
the dependency each item waits on, as int32 tables the kernel (chain.py) reads.

    sched = chain_schedule(dims=(n0, n1, ..., nL), tile_rows=16)
    sched.items      int32 (n_items, ITEM_COLS): stage | row_lo | row_hi | wait_counter |
                     wait_count | signal_counter, in the global order blocks take them
    sched.stages     int32 (n_stages, STAGE_COLS): w_off | x_off | y_off | n_in | n_out
    sched.counters   how many u32 counters the kernel needs (TICKET, EXITED, one per stage)
    validate(sched)  raises ScheduleError unless every item's wait covers every producer of its
                     input and all those producers come earlier in the order

Stage l computes y_{l+1} (n_{l+1},) = act(W_l (n_{l+1}, n_l) @ y_l). The weights of all stages
lie in one flat f32 buffer (W_l row-major at w_off), the activations y_0..y_L in another (y_l
at its offset; offsets rounded up to 4 floats so 16-byte vector loads stay aligned).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

ITEM_COLS = 6        # stage, row_lo, row_hi, wait_counter, wait_count, signal_counter
STAGE_COLS = 5       # w_off, x_off, y_off, n_in, n_out
TICKET, EXITED = 0, 1          # counters[0]: next item; counters[1]: blocks that finished
FIRST_STAGE_COUNTER = 2        # counters[2 + l]: tiles of stage l completed
NO_WAIT = -1
ALIGN = 4                      # floats: offsets are multiples of 16 bytes


class ScheduleError(ValueError):
    """A schedule whose waits do not cover its data dependencies, or that could deadlock."""


class ItemTables:
    """What every schedule's tables answer: items (n_items rows), stages (n_stages rows) and
    the counters a launch needs (the fixed ones, then one per stage)."""
    items: np.ndarray
    stages: np.ndarray

    @property
    def n_items(self) -> int:
        return int(self.items.shape[0])

    @property
    def n_stages(self) -> int:
        return int(self.stages.shape[0])

    @property
    def counters(self) -> int:
        return FIRST_STAGE_COUNTER + self.n_stages


@dataclass(frozen=True)
class Schedule(ItemTables):
    dims: tuple[int, ...]          # n_0 .. n_L
    items: np.ndarray              # int32 (n_items, ITEM_COLS)
    stages: np.ndarray             # int32 (n_stages, STAGE_COLS)
    weight_elems: int              # floats in the flat weight buffer
    act_elems: int                 # floats in the flat activation buffer


    def act_offset(self, layer: int) -> int:
        """Offset of y_layer in the activation buffer (y_0 is the input, y_L the output)."""
        return int(self.stages[layer, 1] if layer < self.n_stages else self.stages[-1, 2])


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def chain_schedule(dims, tile_rows: int) -> Schedule:
    """The chain y_{l+1} = act(W_l y_l) for dims (n_0, ..., n_L), each stage cut into tiles of
    tile_rows output rows (the last tile shorter), items stage by stage; every item of stage
    l > 0 waits until all tiles of stage l - 1 are done (it reads the whole y_l)."""
    dims = tuple(int(d) for d in dims)
    if len(dims) < 2 or min(dims) < 1:
        raise ValueError(f"chain_schedule: dims must be >= 2 positive sizes (n_0 .. n_L), "
                         f"got {dims}")
    if tile_rows < 1:
        raise ValueError(f"chain_schedule: tile_rows must be positive, got {tile_rows}")
    stages, items = [], []
    w_off, act_off = 0, _round_up(dims[0], ALIGN)
    x_off = 0
    for layer, (n_in, n_out) in enumerate(itertools.pairwise(dims)):
        stages.append((w_off, x_off, act_off, n_in, n_out))
        tiles = -(-n_out // tile_rows)
        prev_tiles = -(-n_in // tile_rows)
        for t in range(tiles):
            wait = (NO_WAIT, 0) if layer == 0 else (FIRST_STAGE_COUNTER + layer - 1, prev_tiles)
            items.append((layer, t * tile_rows, min((t + 1) * tile_rows, n_out), *wait,
                          FIRST_STAGE_COUNTER + layer))
        w_off += _round_up(n_out * n_in, ALIGN)
        x_off, act_off = act_off, act_off + _round_up(n_out, ALIGN)
    return Schedule(dims, np.array(items, np.int32).reshape(-1, ITEM_COLS),
                    np.array(stages, np.int32).reshape(-1, STAGE_COLS), w_off, act_off)


def validate(sched: Schedule) -> None:
    """Every item of stage l > 0 must wait on stage l - 1's counter for all its tiles, and all
    of those tiles must come before it in the order (blocks take items in order, so an item
    then waits only on items already taken by running blocks: no deadlock)."""
    validate_chain(sched.items, sched.stages[:, 4].tolist(), sched.counters)


def validate_chain(items: np.ndarray, stage_rows, n_counters: int, extra=None) -> None:
    """validate() for any chain of stages where each stage reads all of the previous one's
    output: items (n_items, ITEM_COLS) as in Schedule; stage_rows[l], how many rows (outputs,
    heads, ...) the tiles of stage l must cover exactly once (the decode schedule uses it);
    extra[l] (default 0): arrivals on stage l's counter after its tiles' (the decode step's
    last tile to arrive publishes once more when it has written the next input's Q8_1)."""
    n_stages = len(stage_rows)
    tiles = np.bincount(items[:, 0], minlength=n_stages)
    needs = tiles + (np.zeros(n_stages, np.int64) if extra is None else np.asarray(extra))
    last_of_stage = {int(np.flatnonzero(items[:, 0] == s)[-1]): s for s in range(n_stages)
                     if tiles[s]}
    done = np.zeros(n_counters, np.int64)
    for k, (stage, lo, hi, wait_counter, wait_count, signal) in enumerate(items.tolist()):
        if stage > 0:
            producer = FIRST_STAGE_COUNTER + stage - 1
            if wait_counter != producer or wait_count != needs[stage - 1]:
                raise ScheduleError(
                    f"item {k} (stage {stage}, rows {lo}:{hi}) waits for {wait_count} on "
                    f"counter {wait_counter}; it reads all of stage {stage - 1}'s output: needs "
                    f"{needs[stage - 1]} on counter {producer}")
            if done[producer] < wait_count:
                raise ScheduleError(
                    f"item {k} (stage {stage}) comes before {wait_count - done[producer]} of "
                    f"the stage {stage - 1} tiles it waits on: blocks could all wait (deadlock)")
        elif wait_counter != NO_WAIT:
            raise ScheduleError(f"item {k} (stage 0) waits on counter {wait_counter}: stage 0 "
                                f"reads only what the host wrote before the launch")
        if signal != FIRST_STAGE_COUNTER + stage:
            raise ScheduleError(f"item {k} signals counter {signal}, not stage {stage}'s")
        done[signal] += 1 + (needs[stage] - tiles[stage] if k in last_of_stage else 0)
    for stage in range(n_stages):
        rows = items[items[:, 0] == stage]
        covered = np.zeros(int(stage_rows[stage]), np.int64)
        for lo, hi in rows[:, 1:3].tolist():
            covered[lo:hi] += 1
        if not (covered == 1).all():
            raise ScheduleError(f"stage {stage}: rows not covered exactly once by its tiles")


def pack_weights(sched: Schedule, weights) -> np.ndarray:
    """The flat f32 weight buffer from the stages' matrices W_l (n_{l+1}, n_l)."""
    if len(weights) != sched.n_stages:
        raise ValueError(f"pack_weights: {sched.n_stages} stages, got {len(weights)} matrices")
    flat = np.zeros(sched.weight_elems, np.float32)
    for layer, w in enumerate(weights):
        w_off, _, _, n_in, n_out = sched.stages[layer].tolist()
        if w.shape != (n_out, n_in):
            raise ValueError(f"pack_weights: W_{layer} must be ({n_out}, {n_in}), got "
                             f"{w.shape}")
        flat[w_off:w_off + n_out * n_in] = np.asarray(w, np.float32).reshape(-1)
    return flat
