"""One decode token of a llama-style model as one persistent launch: the items of
decode_schedule.py, dispatched by kind, waiting on stage counters as chain.py's do.

    runner = DecodeRunner(sched, weights_flat)        # device buffers, once
    runner.set_cache(layer, k, v)                     # rows already in the KV cache (prefill)
    logits = runner.step(token, pos)                  # one launch; K/V of pos written

Input: the flat f32 weights (pack_decode_weights), `io` = [token, pos] (int32, written by the
host before the launch), the KV cache (n_layer, n_head_kv, n_ctx, head_dim) f32 for K and for V
with rows 0..pos-1 filled. Output: logits (n_vocab,) in the activation buffer, K/V row pos of
every layer in the cache, the counters back at zero (replays need no host write but io).

Per item (a block; WARPS warps):
- EMBED: its rows of x = token_embd[token].
- GEMV: rows lo..hi of y (+)= W @ in, a warp per row; in = rmsnorm(x, norm weights) when the
  stage has a norm (every block recomputes the RMS of x: a block_sum), y += for the residual.
- GLU: rows lo..hi of silu(Wg @ h) * (Wu @ h), h the normed x.
- ROPE_KV: one KV head: its k rotated into cache_k[layer, head, pos], its v copied to cache_v,
  the q heads of its group rotated into qrot (stdlib rotary's rope_head).
- ATTN: one query head against cache rows 0..pos: scores (a warp per row) into the scores
  scratch, softmax (block max, block sum), then a thread per output dimension sums the V rows.
The dependency protocol (acquire waits, release publishes, the last block's reset) is chain.py's.
"""
from __future__ import annotations

import math

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64, u32

from .._device import NEG_INF, block_max, block_sum, warp_sum
from ..rotary_kernels import rope_head
from .chain import device_tables, exit_block, launch_grid, next_item, publish
from .decode_schedule import (
    ATTN,
    EMBED,
    GEMV,
    GLU,
    KIND,
    LAYER,
    N_IN,
    NORM,
    RESIDUAL,
    ROPE_KV,
    STAGE_COLS,
    W2,
    DecodeSchedule,
    W,
    X,
    Y,
    validate_decode,
)
from .schedule import ITEM_COLS

WARPS = 8


@pk.func
def normed_rstd(acts: Ptr[f32], x_off: i32, n: i32, eps: f32, scratch) -> f32:
    """Whole block: 1 / sqrt(mean(x^2) + eps) over acts[x_off:x_off + n] (ggml's rms_norm)."""
    ss = f32(0.0)
    for j in range(pk.thread_idx.x, n, pk.block_dim.x):
        v = acts[x_off + j]
        ss += v * v
    return 1.0 / pk.sqrt(block_sum(ss, scratch) / f32(n) + eps)


@pk.func
def dot_row(w: Ptr[f32, "ro"], acts: Ptr[f32], w_row: i64, x_off: i32, n_in: i32, norm: i64,
            rstd: f32, lane: i32) -> f32:
    """One warp: W[row] . in, in = acts[x_off:] or its RMS norm (x * rstd * w[norm + j])."""
    acc = f32(0.0)
    j = lane
    if norm >= 0:
        while j < n_in:
            acc += w[w_row + i64(j)] * (acts[x_off + j] * rstd * w[norm + i64(j)])
            j += 32
    else:
        while j < n_in:
            acc += w[w_row + i64(j)] * acts[x_off + j]
            j += 32
    return warp_sum(acc)


@pk.func
def run_rows(w: Ptr[f32, "ro"], acts: Ptr[f32], st: Ptr[i64, "ro"], kind: i32, lo: i32, hi: i32,
             eps: f32, scratch):
    """GEMV and GLU items: rows lo..hi, a warp per row."""
    n_in = i32(st[N_IN])
    x_off = i32(st[X])
    y_off = i32(st[Y])
    norm = st[NORM]
    rstd = f32(1.0)
    if norm >= 0:
        rstd = normed_rstd(acts, x_off, n_in, eps, scratch)
    lane = pk.thread_idx.x % 32
    row = lo + pk.thread_idx.x // 32
    while row < hi:
        acc = dot_row(w, acts, st[W] + i64(row) * i64(n_in), x_off, n_in, norm, rstd, lane)
        if kind == GLU:
            up = dot_row(w, acts, st[W2] + i64(row) * i64(n_in), x_off, n_in, norm, rstd, lane)
            acc = acc / (f32(1.0) + pk.exp(-acc)) * up
        if lane == 0:
            if st[RESIDUAL] != 0:
                acc = acts[y_off + row] + acc
            acts[y_off + row] = acc
        row += pk.block_dim.x // 32


@pk.func
def run_rope_kv(acts: Ptr[f32], cache_k: Ptr[f32], cache_v: Ptr[f32], st: Ptr[i64, "ro"],
                ff: Ptr[f32, "ro"], kvh: i32, pos: i32, n_head: i32, n_head_kv: i32,
                head_dim: i32, n_ctx: i32, rot_dim: i32, log2_base: f32, NEOX: Const[bool]):
    x_off = i32(st[X])
    k_src = x_off + (n_head + kvh) * head_dim
    v_src = x_off + (n_head + n_head_kv + kvh) * head_dim
    row = ((i64(st[LAYER]) * i64(n_head_kv) + i64(kvh)) * i64(n_ctx) + i64(pos)) * \
        i64(head_dim)
    rope_head(acts + k_src, cache_k + row, pos, head_dim, rot_dim, log2_base, ff, False, NEOX,
              f32, f32(1.0), ff, False, f32(1.0))
    for d in range(pk.thread_idx.x, head_dim, pk.block_dim.x):
        cache_v[row + i64(d)] = acts[v_src + d]
    group = n_head // n_head_kv
    for h in range(kvh * group, (kvh + 1) * group):
        rope_head(acts + x_off + h * head_dim, acts + i32(st[Y]) + h * head_dim, pos, head_dim,
                  rot_dim, log2_base, ff, False, NEOX, f32, f32(1.0), ff, False, f32(1.0))


@pk.func
def run_attention(acts: Ptr[f32], cache_k: Ptr[f32], cache_v: Ptr[f32], st: Ptr[i64, "ro"],
                  h: i32, pos: i32, n_head: i32, n_head_kv: i32, head_dim: i32, n_ctx: i32,
                  scale: f32, scratch):
    """Query head h against cache rows 0..pos of its KV head (scores at st[W2] + h n_ctx)."""
    t = pk.thread_idx.x
    lane = t % 32
    q = i32(st[X]) + h * head_dim
    sc = i32(st[W2]) + h * n_ctx
    base = (i64(st[LAYER]) * i64(n_head_kv) + i64(h // (n_head // n_head_kv))) * i64(n_ctx) * \
        i64(head_dim)
    rows = pos + 1
    r = t // 32
    while r < rows:
        acc = f32(0.0)
        for d in range(lane, head_dim, 32):
            acc += acts[q + d] * cache_k[base + i64(r) * i64(head_dim) + i64(d)]
        acc = warp_sum(acc)
        if lane == 0:
            acts[sc + r] = acc * scale
        r += pk.block_dim.x // 32
    pk.syncthreads()
    m = f32(NEG_INF)
    for r2 in range(t, rows, pk.block_dim.x):
        if acts[sc + r2] > m:
            m = acts[sc + r2]
    m = block_max(m, scratch)
    total = f32(0.0)
    for r3 in range(t, rows, pk.block_dim.x):
        e = pk.exp(acts[sc + r3] - m)
        acts[sc + r3] = e
        total += e
    total = block_sum(total, scratch)     # its barriers order the exp stores before the reads
    for d in range(t, head_dim, pk.block_dim.x):
        o = f32(0.0)
        for r4 in range(rows):
            o += acts[sc + r4] * cache_v[base + i64(r4) * i64(head_dim) + i64(d)]
        acts[i32(st[Y]) + h * head_dim + d] = o / total


@pk.kernel
def decode_kernel(w: Ptr[f32, "ro"], acts: Ptr[f32], cache_k: Ptr[f32], cache_v: Ptr[f32],
                  io: Ptr[i32, "ro"], items: Ptr[i32, "ro"], stages: Ptr[i64, "ro"],
                  counters: Ptr[u32], n_items: i32, n_stages: i32, n_head: i32, n_head_kv: i32,
                  head_dim: i32, n_ctx: i32, rot_dim: i32, log2_base: f32, eps: f32,
                  scale: f32, NEOX: Const[bool]):
    t = pk.thread_idx.x
    taken = pk.shared_array(i32, 1)
    scratch = pk.shared_array(f32, 32)
    token = io[0]
    pos = io[1]
    while True:
        item = next_item(counters, items, n_items, taken, t)
        if item >= n_items:
            break
        st = stages + items[item * ITEM_COLS] * STAGE_COLS
        kind = i32(st[KIND])
        lo = items[item * ITEM_COLS + 1]
        hi = items[item * ITEM_COLS + 2]
        if kind == EMBED:
            table = st[W] + i64(token) * st[N_IN]
            for r in range(lo + t, hi, pk.block_dim.x):
                acts[i32(st[Y]) + r] = w[table + i64(r)]
        elif kind == GEMV or kind == GLU:
            run_rows(w, acts, st, kind, lo, hi, eps, scratch)
        elif kind == ROPE_KV:
            for kvh in range(lo, hi):
                run_rope_kv(acts, cache_k, cache_v, st, w, kvh, pos, n_head, n_head_kv,
                            head_dim, n_ctx, rot_dim, log2_base, NEOX)
        elif kind == ATTN:
            for h in range(lo, hi):
                run_attention(acts, cache_k, cache_v, st, h, pos, n_head, n_head_kv, head_dim,
                              n_ctx, scale, scratch)
                pk.syncthreads()         # the next head reuses the scratch
        publish(counters, items[item * ITEM_COLS + 5], t)
    exit_block(counters, n_stages, t)


class DecodeRunner:
    """Device buffers for one model's decode schedule: weights, activations, the KV cache
    (f32), io, tables, counters; `step(token, pos)` runs one token in one launch of `grid`
    blocks (default: the co-resident grid)."""

    def __init__(self, sched: DecodeSchedule, weights_flat, *, eps: float, scale: float,
                 rope_theta: float, rot_dim: int, neox: bool, grid: int | None = None):
        validate_decode(sched)
        s = sched.shape
        if weights_flat.dtype != np.float32 or weights_flat.size != sched.weight_elems:
            raise ValueError(f"DecodeRunner: weights must be float32 with {sched.weight_elems} "
                             f"elements (pack_decode_weights), got {weights_flat.dtype} "
                             f"{tuple(weights_flat.shape)}")
        if rot_dim % 2 or not 0 < rot_dim <= s.head_dim:
            raise ValueError(f"DecodeRunner: rot_dim must be even and in (0, {s.head_dim}], "
                             f"got {rot_dim}")
        self.sched, self.neox = sched, bool(neox)
        self.scalars = (s.n_head, s.n_head_kv, s.head_dim, s.n_ctx, int(rot_dim),
                        math.log2(rope_theta), float(eps), float(scale))
        self.weights = pk.to_device(weights_flat) if isinstance(weights_flat, np.ndarray) \
            else weights_flat
        self.acts = pk.full(sched.act_elems, np.nan, np.float32)   # unwritten values show
        cache = (s.n_layer, s.n_head_kv, s.n_ctx, s.head_dim)
        self.cache_k = pk.zeros(cache, np.float32)
        self.cache_v = pk.zeros(cache, np.float32)
        self.io = pk.zeros(2, np.int32)
        self.items, self.stages, self.counters = device_tables(sched)
        self.block = WARPS * 32
        self.grid = launch_grid("DecodeRunner", grid, decode_kernel, self.block, NEOX=self.neox)

    def set_cache(self, layer: int, k, v) -> None:
        """K and V rows 0..n-1 of `layer`: (n_head_kv, n, head_dim) each (a prefill's)."""
        s = self.sched.shape
        k, v = np.asarray(k, np.float32), np.asarray(v, np.float32)
        if k.shape != v.shape or k.ndim != 3 or k.shape[0] != s.n_head_kv or \
                k.shape[2] != s.head_dim or k.shape[1] > s.n_ctx:
            raise ValueError(f"DecodeRunner.set_cache: K and V must be (n_head_kv={s.n_head_kv}"
                             f", rows <= {s.n_ctx}, head_dim={s.head_dim}), got {k.shape} and "
                             f"{v.shape}")
        for dev, rows in ((self.cache_k, k), (self.cache_v, v)):
            host = dev.numpy()
            host[layer, :, :rows.shape[1]] = rows
            dev.copy_from(host)

    def set_io(self, token: int, pos: int) -> None:
        s = self.sched.shape
        if not 0 <= token < s.n_vocab or not 0 <= pos < s.n_ctx:
            raise ValueError(f"DecodeRunner: token {token} must be in [0, {s.n_vocab}) and "
                             f"position {pos} in [0, {s.n_ctx}) (the cache's rows)")
        self.io.copy_from(np.array([token, pos], np.int32))

    def reset(self) -> None:
        """Zero the counters from the host (only needed after a launch that failed)."""
        self.counters.fill(0)

    def launch(self, stream=None) -> None:
        decode_kernel[self.grid, self.block, stream](
            self.weights, self.acts, self.cache_k, self.cache_v, self.io, self.items,
            self.stages, self.counters, self.sched.n_items, self.sched.n_stages, *self.scalars,
            self.neox)

    def logits(self) -> np.ndarray:
        off, n = self.sched.acts["logits"]
        return self.acts.numpy()[off:off + n]

    def step(self, token: int, pos: int) -> np.ndarray:
        """Logits (n_vocab,) after `token` at `pos`; K/V row pos of every layer written."""
        self.set_io(token, pos)
        self.launch()
        return self.logits()
