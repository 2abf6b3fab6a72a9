"""Tokens grouped by expert for prompts (llama.cpp's mul_mat_id idea), built on the device.

    group_kernel    one block: ids (pairs,) i32 (pair p = token p // k, slot p % k) ->
                    order (pairs,): the pairs sorted by expert, stable (token order within an
                    expert); slot_of (pairs,): each pair's position in that order; tiles
                    (max_tiles, 3) i32: (expert, first position, count <= BATCH) covering each
                    expert's run, then (0, 0, 0) up to max_tiles (a fixed grid for capture).
    gather_kernel   dst[s] = src[order[s] // k] (rows of `words` u32 words: Q8_1 or f32 rows)
    combine_kernel  y[t] = (res[t] +) sum_j route_w[t, j] (ys[slot_of[t k + j]] (+ bias[e]))
                    (j in order; e = ids[t k + j], HAS_BIAS: bias (n_expert, rows))

Counts by shared atomics (integers: exact in any order), positions by a warp-wide scan per
expert (ballot of the lanes holding that expert, 32 pairs a step), so the order is stable and
deterministic: 4096 pairs over 128 experts cost each of 32 warps 4 x 128 steps (the scan by
one thread per expert before cost 2 x 4096 dependent loads each).
group_reference is the numpy model of group_kernel.
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32

GROUP_THREADS = 1024


def max_tiles(pairs: int, n_expert: int, batch: int) -> int:
    """Tiles that any routing of `pairs` pairs over n_expert experts can need: each used
    expert's run is split into ceil(count / batch) tiles."""
    return (pairs + batch - 1) // batch + min(n_expert, pairs)


@pk.kernel
def group_kernel(ids: Ptr[i32, "ro"], order: Ptr[i32], slot_of: Ptr[i32], tiles: Ptr[i32],
                 pairs: i32, n_expert: i32, n_tiles: i32, BATCH: Const[int],
                 MAX_EXPERTS: Const[int]):
    counts = pk.shared_array(i32, MAX_EXPERTS)
    starts = pk.shared_array(i32, MAX_EXPERTS)
    tid = pk.thread_idx.x
    for e in range(tid, n_expert, pk.block_dim.x):
        counts[e] = 0
    for t in range(tid, n_tiles, pk.block_dim.x):
        tiles[3 * t] = 0
        tiles[3 * t + 1] = 0
        tiles[3 * t + 2] = 0
    pk.syncthreads()
    for p in range(tid, pairs, pk.block_dim.x):   # counts: integers, exact in any order
        e = ids[p]
        if e >= 0 and e < n_expert:
            pk.atomic_add(counts, e, 1)
    pk.syncthreads()
    if tid == 0:   # prefix sums and the tile list: n_expert steps, serial
        start = 0
        tile = 0
        for e in range(n_expert):
            starts[e] = start
            c = counts[e]
            q = 0
            while q < c:
                tiles[3 * tile] = e
                tiles[3 * tile + 1] = start + q
                tiles[3 * tile + 2] = min(BATCH, c - q)
                tile += 1
                q += BATCH
            start += c
    pk.syncthreads()
    # positions, stable: warp w places experts w, w + warps, ...; its lanes scan 32 pairs a
    # step, a pair's place is the expert's next free one plus its matching lanes below it
    lane = tid % 32
    below = (u32(1) << u32(lane)) - u32(1)
    for e in range(tid // 32, n_expert, pk.block_dim.x // 32):
        pos = starts[e]
        for p0 in range(0, pairs, 32):
            p = p0 + lane
            hit = p < pairs and ids[min(p, pairs - 1)] == e
            mask = pk.ballot(hit)
            if hit:
                at = pos + pk.popc(mask & below)
                order[at] = p
                slot_of[p] = at
            pos += pk.popc(mask)


@pk.kernel
def gather_kernel(src: Ptr[u32, "ro"], dst: Ptr[u32], order: Ptr[i32, "ro"], words: i32,
                  k: i32):
    s = pk.block_idx.x         # x: pairs may exceed the 65535 blocks of a grid's y
    t = order[s] // k
    for i in range(pk.thread_idx.x, words, pk.block_dim.x):
        dst[s * words + i] = src[t * words + i]


@pk.kernel
def combine_kernel(ys: Ptr[f32, "ro"], slot_of: Ptr[i32, "ro"], route_w: Ptr[f32, "ro"],
                   bias: Ptr[f32, "ro"], ids: Ptr[i32, "ro"], res: Ptr[f32], y: Ptr[f32],
                   rows: i32, K: Const[int], HAS_RES: Const[bool], HAS_BIAS: Const[bool]):
    t = pk.block_idx.y
    r = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if r < rows:
        total = f32(0.0)
        for j in pk.static_range(K):
            out = ys[slot_of[t * K + j] * rows + r]
            if HAS_BIAS:
                out = out + bias[ids[t * K + j] * rows + r]
            v = route_w[t * K + j] * out
            total = v if j == 0 else total + v
        if HAS_RES:
            total = res[t * rows + r] + total
        y[t * rows + r] = total


def group_into(ids, order, slot_of, tiles, pairs: int, n_expert: int, batch: int,
               stream=None) -> None:
    """Launch group_kernel (module docstring) on device arrays; tiles holds max_tiles rows."""
    n_tiles = max_tiles(pairs, n_expert, batch)
    if tiles.size < 3 * n_tiles or order.size < pairs or slot_of.size < pairs:
        raise ValueError(f"group: buffers too small for {pairs} pairs ({n_tiles} tiles)")
    most = max(32, 1 << (n_expert - 1).bit_length())
    group_kernel[1, GROUP_THREADS, stream](ids, order, slot_of, tiles, pairs, n_expert,
                                           n_tiles, batch, most)


def group_reference(ids: np.ndarray, n_expert: int, batch: int):
    """numpy (order, slot_of, tiles (max_tiles, 3)) for flat ids, as group_kernel builds them."""
    ids = np.asarray(ids).reshape(-1)
    order = np.argsort(ids, kind="stable").astype(np.int32)
    slot_of = np.empty_like(order)
    slot_of[order] = np.arange(ids.size, dtype=np.int32)
    tiles = np.zeros((max_tiles(ids.size, n_expert, batch), 3), np.int32)
    tile, start = 0, 0
    for e in range(n_expert):
        c = int((ids == e).sum())
        for q in range(0, c, batch):
            tiles[tile] = (e, start + q, min(batch, c - q))
            tile += 1
        start += c
    return order, slot_of, tiles
