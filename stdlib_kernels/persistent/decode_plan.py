"""The persistent decode step's item sizes for one model, chosen when it is loaded: rows per
GEMV / GLU tile per stage, attention splits per head and their granule (decode_schedule's
tile_rows, attn_splits, split_rows).

    plan = plan_items(shape, grid)          # grid: the launch's blocks (co-resident)
    sched = decode_schedule(shape, plan.tile_rows, formats, plan.attn_splits, plan.split_rows)

Why per stage: a stage's time on the chain is its slowest block's, so a stage of at most `grid`
items runs in one round (every item starts when the stage before is done, and its weights were
prefetched into L2 when its ticket was drawn); beyond that, blocks loop and the stage takes
rounds x item time. A warp's row is the unit of latency (one row's dot per warp), so rows per
warp = ceil(n_out / (grid WARPS)) and the tile is that times WARPS: SmolLM2-135M (576 wide,
n_ff 1536) keeps one row per warp in every layer stage (8-row tiles: 72-192 items, under
a grid of ~400), its 49152-row LM head 16 rows a warp; llama-8B (4096 wide, n_ff 14336) gets
16-row tiles for qkv / o / down and 40 for gate|up, so no stage loops over the grid, and
each item's rows stream from L2 after its prefetch. Attention: splits of split_rows (16) cache
rows at short positions (5 used at position 64), at most MAX_SPLITS and at most grid / n_head
per head (one round), and n_ctx / split_rows (no splits that can never be used).
These are starting points, not measured optima: benchmarks/persistent_decode.py sweeps uniform
tiles beside this plan.
"""
from __future__ import annotations

from dataclasses import dataclass

from .decode import WARPS
from .decode_schedule import MAX_SPLITS, ROW_STAGES, DecodeShape

SPLIT_ROWS = 16      # cache rows per split at short positions (one V_ROWS batch)


@dataclass(frozen=True)
class ItemPlan:
    tile_rows: dict          # stage name -> rows per item
    attn_splits: int
    split_rows: int


def _rows(shape: DecodeShape) -> dict:
    e = shape.n_embd
    return {"embed": e, "qkv": shape.q_rows + 2 * shape.kv_rows, "o": e,
            "gate_up": shape.n_ff, "down": e, "lm_head": shape.n_vocab}


def plan_items(shape: DecodeShape, grid: int) -> ItemPlan:
    """The item sizes of one model's step on a launch of `grid` blocks (module docstring)."""
    if grid < 1:
        raise ValueError(f"plan_items: grid must be positive, got {grid}")
    rows = _rows(shape)
    tiles = {name: WARPS * -(-rows[name] // (grid * WARPS)) for name in ROW_STAGES}
    splits = max(1, min(MAX_SPLITS, grid // shape.n_head, -(-shape.n_ctx // SPLIT_ROWS)))
    return ItemPlan(tiles, splits, SPLIT_ROWS)
