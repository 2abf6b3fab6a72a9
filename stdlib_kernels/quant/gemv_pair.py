"""Two decode GEMVs of different GGUF types on the same Q8_1 activations in one launch.

    gemv_q8_pair_into(parts, xq, n, mode=None)   parts: two GemvPart(words, type_name, rows,
        y, res); each y (rows,) = W x (+ res in mode "residual"), one token
    pair_eligible(type_a, rows_a, type_b, rows_b, n, xq) -> bool

Why: a fused projection whose row groups are stored in two types (llama.cpp's Q4_K_M files
keep attn_v in Q6_K in half the layers: q|k Q4_K, v Q6_K) took one GEMV launch per type, and
the second one's wait, activation loads and reduction tail sat on the decode step's critical
path after the first's (H200, 8B: 4.4 us per such layer). Here the first blocks of the grid
run part A's row groups and the rest part B's, each with its own format, tiling and weights
(gemv_kernels.rows_dot, the register DP4A kernel's row-group body), so both tails overlap.
Both parts use their usual tuned shape (gemv.gemv_config); eligible when those shapes share a
block size and neither takes the bulk-copy kernel, a persistent grid or staged activations.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32

from . import gemv_kernels as gk
from .gemv import (MODES, Q8_1_TYPES, _bulk, _check_out, _under_pdl, gemv_config,
                   register_plan)
from .q8_1 import q8_1_bytes


class GemvPart(NamedTuple):
    """One matrix of a pair: weight words (gemv.weight_words), its GGUF type, its rows, the
    output y (rows,) and, for mode "residual", res (rows,) (may be y)."""
    words: object
    type_name: str
    rows: int
    y: object
    res: object = None


@pk.kernel
def gemv_q8_pair_kernel(wa: Ptr["WA", "ro"], wb: Ptr["WB", "ro"], xq: Ptr[u32, "ro"],
                        res_a: Ptr[f32], ya: Ptr[f32], res_b: Ptr[f32], yb: Ptr[f32],
                        rows_a: i32, rows_b: i32, words_a: i32, words_b: i32, nblocks_a: i32,
                        nblocks_b: i32, groups_a: i32, xq_words: i32,
                        FA: Const[int], WA: Const[pk.dtype], ITEMS_A: Const[int],
                        ROWS_A: Const[int], KW_A: Const[int], UNROLL_A: Const[int],
                        WIDEN_A: Const[int], FB: Const[int], WB: Const[pk.dtype],
                        ITEMS_B: Const[int], ROWS_B: Const[int], KW_B: Const[int],
                        UNROLL_B: Const[int], WIDEN_B: Const[int], WARPS: Const[int],
                        MODE: Const[int], PREFETCH: Const[bool]):
    # blocks [0, groups_a): part A's row groups (one per block); the rest: part B's
    bid = pk.block_idx.x
    if bid < groups_a:
        per = ROWS_A * (WARPS // KW_A)
        gk.prefetch_then_wait(wa, wa, bid * per, per, rows_a, words_a, WA, MODE, PREFETCH)
        gk.rows_dot(wa, wa, xq, res_a, ya, rows_a, words_a, nblocks_a, xq_words, bid, FA,
                    ITEMS_A, WARPS, 1, MODE, ROWS_A, KW_A, UNROLL_A, WIDEN_A)
    else:
        per = ROWS_B * (WARPS // KW_B)
        b = bid - groups_a
        gk.prefetch_then_wait(wb, wb, b * per, per, rows_b, words_b, WB, MODE, PREFETCH)
        gk.rows_dot(wb, wb, xq, res_b, yb, rows_b, words_b, nblocks_b, xq_words, b, FB,
                    ITEMS_B, WARPS, 1, MODE, ROWS_B, KW_B, UNROLL_B, WIDEN_B)


def _plan(type_name: str, rows: int, n: int, xq):
    """(config, gemv.RegisterPlan) of one part, or None where the pair kernel does not apply
    to it."""
    if type_name not in Q8_1_TYPES or _bulk(type_name, 1, None, rows, n, None):
        return None
    c = gemv_config(type_name, 1, n)
    if c.per_sm or c.stage_x or c.kernel == "bulk":
        return None
    return c, register_plan(type_name, rows, n, xq, 1, c)


def pair_eligible(type_a: str, rows_a: int, type_b: str, rows_b: int, n: int, xq) -> bool:
    """Both parts run the register DP4A kernel with block shapes of the same size."""
    a, b = _plan(type_a, rows_a, n, xq), _plan(type_b, rows_b, n, xq)
    return a is not None and b is not None and a[0].warps == b[0].warps


def gemv_q8_pair_into(parts, xq, n: int, mode=None, stream=None) -> None:
    """Each part's y = W x (+ res) for one token, in one launch (see the module docstring)."""
    if len(parts) != 2:
        raise ValueError(f"gemv pair: needs two parts, got {len(parts)}")
    if mode not in (None, "residual"):
        raise ValueError(f"gemv pair: mode {mode!r}, expected None or 'residual'")
    if xq.nbytes < q8_1_bytes(n):
        raise ValueError(f"gemv pair: activations of {xq.nbytes} bytes, rows of {n} values "
                         f"need {q8_1_bytes(n)}")
    plans = [_plan(p.type_name, p.rows, n, xq) for p in parts]
    for p, plan in zip(parts, plans):
        if plan is None:
            raise ValueError(f"gemv pair: {p.type_name} ({p.rows} x {n}) does not take the "
                             "register DP4A kernel (pair_eligible)")
        _check_out(p.y, 1, p.rows, "gemv pair")
        if (mode == "residual") != (p.res is not None):
            raise ValueError(f"gemv pair: mode {mode!r} "
                             f"{'needs' if p.res is None else 'takes no'} res")
    warps = plans[0][0].warps
    if plans[1][0].warps != warps:
        raise ValueError(f"gemv pair: the parts' tuned blocks differ ({warps} and "
                         f"{plans[1][0].warps} warps; pair_eligible)")
    args, consts = [], []
    for p, (c, plan) in zip(parts, plans):
        w = p.words.view(np.uint32) if plan.as_u32 else p.words
        args.append((w, p.y if p.res is None else p.res, p.y, p.rows,
                     plan.row_bytes // w.itemsize, plan.blocks))
        consts += [plan.fmt_id, w.dtype, plan.items, c.rows, c.split, c.unroll, plan.widen]
    (wa, ra, ya, rows_a, wda, nba), (wb, rb, yb, rows_b, wdb, nbb) = args
    groups_a, groups_b = plans[0][1].groups, plans[1][1].groups
    gemv_q8_pair_kernel[groups_a + groups_b, 32 * warps, stream](
        wa, wb, xq.reshape(-1).view(np.uint32), ra, ya, rb, yb, rows_a, rows_b, wda, wdb,
        nba, nbb, groups_a, q8_1_bytes(n) // 4, *consts, warps, MODES[mode], _under_pdl())
