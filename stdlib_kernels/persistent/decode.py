"""One decode token of a llama-style model as one persistent launch: the items of
decode_schedule.py, dispatched by kind, waiting on stage counters as chain.py's do (the host
side, buffers and launches: decode_runner.py).

Input: the weight buffer (decode_weights.py: matrices in their GGUF formats, norms F32) seen as
u8 / u16 / u32 / f32 words, `io` = [token, pos] (int32 on the device: written by the host or by
the argmax of the step before, so a captured graph replays with no host copy), the KV cache (C =
f16 or f32): K and V of layer l, KV head h, row p at kv_base + l kv_layer + (h n_ctx + p)
head_dim, rows 0..pos-1 filled (the runner's KVPool layout: one allocation for all layers).
Output: logits (n_vocab,) in the activation buffer, K/V row pos of every layer in the cache, the
counters back at zero.

Per item (a block of WARPS warps):
- EMBED: its rows of x = token_embd[token] (dequantize_one per value).
- QUANT: Q8_1 blocks lo..hi of the next matrix's input (normed: every item recomputes the
  RMS of x in the decode graph's order) into the xq buffer, a warp per block.
- GEMV: rows lo..hi of y (+)= W @ in, a warp per row; quantized rows dot the Q8_1 input its
  QUANT stage wrote (decode_rows.py), F32 rows x itself, normed (the item's own RMS of x)
  when the stage has a norm; y += for the residual.
- GLU: rows lo..hi of silu(Wg @ h) * (Wu @ h), h the normed x; when the down projection is
  quantized (st[Q_OUT]), then the Q8_1 blocks of that output the item completes
  (decode_rows.publish_q8_1_groups), so the down items wait on the GLU stage alone.
- ATTN: one split of one query head's cache rows (flash-decoding, decode_attn.py), the RoPE
  of q and of this token's k and the cache write of its K/V row fused in; the last split of
  a head to finish merges the head and writes its output as Q8_1 for the O-projection.
A GEMV / EMBED stage writing x whose next matrix reads its normed Q8_1 (st[Q_OUT], folded by
decode_schedule's fold_norm_blocks) publishes through decode_rows.arrive_and_quantize: the last
item to arrive writes that input and publishes again.
The dependency protocol (acquire waits, release publishes, the last block's reset) is chain.py's;
the attention's per-head arrival counters (counters[FIRST_STAGE_COUNTER + n_stages + h]) are
reset by the merging block, the GLU output's per-block ones (after the heads') by the item
completing the block.
A block takes its items through decode_take.take_item, which prefetches a GEMV / GLU item's
weight rows into L2 before waiting (PREFETCH) and, in the profiling build (PROFILE), stamps
each item's times into prof (a 1-element dummy otherwise).

Latency, not bandwidth, bounds most links of this chain (5 to 8 stages a layer, each waiting for
the one before), so loads are issued together where the order of the sums allows: the
attention's score rows SCORE_ROWS per warp, its V rows V_ROWS at a time per dimension
(decode_attn.py), the residual before the row's dot, ROW_UNROLL items a lane of a long row
(decode_rows.py).
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64, u8, u16, u32, u64

from ..quant.formats import F32
from ..quant.q8_1 import store_q8_1_block
from .chain import exit_block, publish
from .decode_attn import run_attention_item
from .decode_rows import (
    NAN,
    arrive_and_quantize,
    embed_value,
    graph_rstd,
    input_value,
    publish_q8_1_groups,
    row_dot,
)
from .decode_schedule import (
    ATTN,
    EMBED,
    FMT,
    FMT_B,
    GEMV,
    GLU,
    KIND,
    MAX_HEAD_DIM,
    MAX_SPLITS,
    N_IN,
    N_OUT,
    NORM,
    Q_OUT,
    QUANT,
    RESIDUAL,
    ROW_BYTES,
    ROW_BYTES_B,
    SPLIT,
    STAGE_COLS,
    W_B,
    XQ,
    W,
    X,
    Y,
)
from .decode_take import DONE, PREPPED, stamp, take_item
from .schedule import FIRST_STAGE_COUNTER, ITEM_COLS

WARPS = 8


@pk.func
def run_rows(w16: Ptr[u16, "ro"], w32: Ptr[u32, "ro"], wf: Ptr[f32, "ro"], acts: Ptr[f32],
             xq: Ptr[u32], st: Ptr[i64, "ro"], kind: i32, lo: i32, hi: i32, eps: f32, scratch,
             prof: Ptr[u64], item: i32, PROFILE: Const[bool]):
    """GEMV and GLU items: rows lo..hi, a warp per row; quantized rows read the Q8_1 input at
    st[XQ] (its QUANT stage's), F32 rows x, normed here (graph_rstd) when the stage has a
    norm."""
    n_in = i32(st[N_IN])
    x_off = i32(st[X])
    y_off = i32(st[Y])
    norm = st[NORM]
    rstd = f32(1.0)
    if norm >= 0 and (st[FMT] == F32 or st[FMT_B] == F32):
        rstd = graph_rstd(acts, x_off, n_in, eps, scratch)
    stamp(prof, item, PREPPED, PROFILE)
    lane = pk.thread_idx.x % 32
    row = lo + pk.thread_idx.x // 32
    residual = st[RESIDUAL] != 0
    while row < hi:
        old = f32(0.0)
        if residual and lane == 0:   # loaded before the dot: its latency overlaps the row's
            old = acts[y_off + row]
        fmt, off = row_place(st, row)
        xin = xq + i32(max(st[XQ], i64(0)))      # per row: not live across the loop
        acc = row_dot(fmt, w16, w32, wf, off, acts, x_off, n_in, norm, rstd, xin, lane)
        if kind == GLU:
            fmt2, off2 = row_place(st, row + i32(st[N_OUT]))
            up = row_dot(fmt2, w16, w32, wf, off2, acts, x_off, n_in, norm, rstd, xin, lane)
            acc = acc / (f32(1.0) + pk.exp(-acc)) * up
        if lane == 0:
            if residual:
                acc = acc + old
            acts[y_off + row] = acc
        row += pk.block_dim.x // 32


@pk.func
def run_quant(acts: Ptr[f32], wf: Ptr[f32, "ro"], xq: Ptr[u32], st: Ptr[i64, "ro"], lo: i32,
              hi: i32, eps: f32, scratch):
    """QUANT items: Q8_1 blocks lo..hi of the input (x, or x * rstd * norm weights) into xq at
    st[XQ], warp w taking blocks lo + w, lo + w + 8, ...: the bits rmsnorm_q8_1 / quantize_q8_1
    write in the decode graph (the same input_value and store_q8_1_block)."""
    n = i32(st[N_IN])
    x_off = i32(st[X])
    norm = st[NORM]
    rstd = f32(1.0)
    if norm >= 0:
        rstd = graph_rstd(acts, x_off, n, eps, scratch)
    lane = pk.thread_idx.x % 32
    out = xq + i32(st[XQ])
    blk = lo + pk.thread_idx.x // 32
    while blk < hi:                  # warp-uniform
        store_q8_1_block(input_value(acts, x_off, blk * 32 + lane, wf, norm, rstd), lane, out,
                         blk)
        blk += pk.block_dim.x // 32


@pk.func
def row_place(st: Ptr[i64, "ro"], r: i32):
    """(format, byte offset) of matrix row r: group A below SPLIT, else group B."""
    fmt = i32(st[FMT])
    off = st[W] + i64(r) * st[ROW_BYTES]
    if i64(r) >= st[SPLIT]:
        fmt = i32(st[FMT_B])
        off = st[W_B] + (i64(r) - st[SPLIT]) * st[ROW_BYTES_B]
    return fmt, off


@pk.func
def run_embed(w8: Ptr[u8, "ro"], wf: Ptr[f32, "ro"], acts: Ptr[f32], st: Ptr[i64, "ro"],
              token: i32, n_vocab: i32, lo: i32, hi: i32):
    """Rows lo..hi of x = token_embd[token]; a token outside [0, n_vocab) gives NaN (a
    device pick's -1 for a broken step), never a read outside the table."""
    valid = token >= 0 and token < n_vocab
    row = st[W] + i64(token if valid else 0) * st[ROW_BYTES]
    for c in range(lo + pk.thread_idx.x, hi, pk.block_dim.x):
        v = f32(NAN)
        if valid:
            v = embed_value(i32(st[FMT]), w8, wf, row, c)
        acts[i32(st[Y]) + c] = v


@pk.kernel(max_threads=WARPS * 32, min_blocks=3)   # <= 85 registers: 3 blocks an SM
def decode_kernel(w8: Ptr[u8, "ro"], w16: Ptr[u16, "ro"], w32: Ptr[u32, "ro"],
                  wf: Ptr[f32, "ro"], acts: Ptr[f32], xq: Ptr[u32], cache_k: Ptr["C"],
                  cache_v: Ptr["C"], io: Ptr[i32], items: Ptr[i32, "ro"], stages: Ptr[i64, "ro"],
                  counters: Ptr[u32], prof: Ptr[u64], n_items: i32, n_stages: i32,
                  n_vocab: i32, n_head: i32, n_head_kv: i32, head_dim: i32, n_ctx: i32,
                  kv_base: i64, kv_layer: i64, rot_dim: i32, log2_base: f32, eps: f32,
                  scale: f32, NEOX: Const[bool], C: Const[pk.dtype], PREFETCH: Const[bool],
                  PROFILE: Const[bool]):
    # io is a plain pointer: in a decode graph the argmax before this launch writes it, and
    # an "ro" (ld.global.nc) load may be hoisted above the PDL wait (docs/language.md)
    t = pk.thread_idx.x
    taken = pk.shared_array(i32, 1)
    flag = pk.shared_array(i32, 1)
    edge = pk.shared_array(i32, 2)                   # a GLU item's shared Q8_1 blocks: mine?
    scratch = pk.shared_array(f32, 32)
    qs = pk.shared_array(f32, MAX_HEAD_DIM)          # an ATTN item's rotated q
    ks = pk.shared_array(C, MAX_HEAD_DIM)            # ... and this token's K / V row
    vs = pk.shared_array(C, MAX_HEAD_DIM)
    ml = pk.shared_array(f32, 2 * MAX_SPLITS)        # the merge's split weights and sums
    token = io[0]
    pos = io[1]
    while True:
        item = take_item(w8, counters, items, stages, n_items, taken, t, prof, PREFETCH,
                         PROFILE)
        if item >= n_items:
            break
        st = stages + items[item * ITEM_COLS] * STAGE_COLS
        kind = i32(st[KIND])
        lo = items[item * ITEM_COLS + 1]
        hi = items[item * ITEM_COLS + 2]
        if kind == EMBED:
            run_embed(w8, wf, acts, st, token, n_vocab, lo, hi)
        elif kind == GEMV or kind == GLU:
            run_rows(w16, w32, wf, acts, xq, st, kind, lo, hi, eps, scratch, prof, item,
                     PROFILE)
            if st[Q_OUT] >= 0:
                publish_q8_1_groups(acts, xq, counters, st, lo, hi,
                                    FIRST_STAGE_COUNTER + n_stages + n_head, edge)
        elif kind == QUANT:
            run_quant(acts, wf, xq, st, lo, hi, eps, scratch)
        elif kind == ATTN:
            run_attention_item(acts, xq, cache_k, cache_v, counters, st, wf, lo,
                               FIRST_STAGE_COUNTER + n_stages, pos, n_head, n_head_kv,
                               head_dim, n_ctx, kv_base, kv_layer, rot_dim, log2_base, scale,
                               scratch, qs, ks, vs, ml, flag, NEOX, C)
        if st[Q_OUT] >= 0 and kind != GLU:
            arrive_and_quantize(acts, wf, xq, counters, st, items[item * ITEM_COLS + 5], eps,
                                scratch, flag)
        else:
            publish(counters, items[item * ITEM_COLS + 5], t)
        stamp(prof, item, DONE, PROFILE)
    exit_block(counters, n_stages, t)
