"""The persistent decode step's attention items (decode.py's ATTN kind): flash-decoding splits
with the RoPE of q and k and the KV-cache write fused in, and the merge of a head's splits by
the last of them to finish, which also writes the head's output as Q8_1 for the O-projection.

Input: the QKV output of this token (acts at st[X]: q heads, k heads, v heads, unrotated), the
KV cache rows 0..pos-1 of the layer (C = f16 / f32), pos. Output: attn (acts at st[Y], (n_head,
head_dim) f32), its Q8_1 blocks in the xq buffer at st[XQ] (when >= 0), K/V row pos of the layer
in the cache; scratch: scores at st[W2] + h n_ctx + row, the split partials at st[PART].

Item lo = h n_split + j: split j of query head h. Its rows: L = split_len(pos, n_split, granule)
rows each (a multiple of the granule, at least ceil((pos + 1) / n_split)), split j takes rows
j L .. min((j + 1) L, pos + 1); splits past the last row have nothing to do (positions below
the granule use split 0 only). A split with rows:
- rotates q_h into shared memory (every split of the head the same bits), and if it holds row
  pos (the last used split), rotates the KV head's k and rounds k and v to C in shared memory:
  row pos is read from there, not from the cache, so no item waits on another's cache write;
  the split of the group's first query head also writes them to the cache (one writer per KV
  head and layer);
- scores its rows (decode graph order: a warp per row, lanes over the head's dims), softmax
  partials m = max, l = sum exp(s - m) (block reductions, thread t summing rows r0 + t, r0 + t
  + 256, ...), o[d] = sum_r exp(s_r - m) V[r, d] in row order; stores o, m, l.
Every used split then counts itself on the head's arrival counter (acq_rel: it publishes its
partials and, for the last one, acquires all the others'; the count of used splits follows
from pos, so splits past the last row neither run nor count). The last merges:
M = max m_j, w_j = exp(m_j - M), out[d] = sum_j w_j o_j[d] / sum_j w_j l_j; with one used split
out = o_0[d] / l_0, exactly the unsplit item's arithmetic (so a step below the granule has the
bits it had before the split), and resets the counter to zero for the next layer and launch.
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64, u32

from .._device import NEG_INF, block_max, block_sum, warp_sum
from ..quant.q8_1 import store_q8_1_block
from ..rotary_kernels import rope_head
from .decode_rows import NAN
from .decode_schedule import LAYER, MAX_SPLITS, N_SPLIT, PART, SPLIT_ROWS, W2, XQ, X, Y

SCORE_ROWS = 4       # cache rows a warp's score loop loads at once (their loads overlap)
V_ROWS = 16          # cache rows the output loop loads at once per output dimension
MERGE_BATCH = 8      # split partials the merge loads at once per output dimension


@pk.func
def split_len(pos: i32, n_split: i32, granule: i32) -> i32:
    """Rows per split at position pos: ceil((pos + 1) / n_split) rounded up to the granule."""
    per = (pos + n_split) // n_split
    return (per + granule - 1) // granule * granule


@pk.func
def split_scores(acts: Ptr[f32], cache_k, qs, ks, sc: i32, base: i64, r0: i32, n_cache: i32,
                 has_pos: bool, head_dim: i32, scale: f32):
    """acts[sc + r] = q . K row r * scale for cache rows r0 .. r0 + n_cache (a warp per row,
    lanes over the head's dims, then warp_sum; SCORE_ROWS rows a warp visit so their loads
    are in flight together) and, with has_pos, row r0 + n_cache (= pos) from ks, by the last
    warp: each row's sum the same, in the same order, whichever warp takes it."""
    lane = pk.thread_idx.x % 32
    acc = pk.local_array(f32, SCORE_ROWS)
    r = pk.thread_idx.x // 32 * SCORE_ROWS
    while r < n_cache:
        for k in pk.static_range(SCORE_ROWS):
            acc[k] = 0.0
        for d in range(lane, head_dim, 32):
            qd = qs[d]
            for k in pk.static_range(SCORE_ROWS):
                kr = r0 + min(r + k, n_cache - 1)    # past the last: a valid row, unused
                acc[k] += qd * f32(cache_k[base + i64(kr) * i64(head_dim) + i64(d)])
        for k in pk.static_range(SCORE_ROWS):
            total = warp_sum(acc[k])
            if lane == 0 and r + k < n_cache:
                acts[sc + r0 + r + k] = total * scale
        r += pk.block_dim.x // 32 * SCORE_ROWS
    if has_pos and pk.thread_idx.x // 32 == pk.block_dim.x // 32 - 1:
        a = f32(0.0)
        for d in range(lane, head_dim, 32):
            a += qs[d] * f32(ks[d])
        total = warp_sum(a)
        if lane == 0:
            acts[sc + r0 + n_cache] = total * scale
    pk.syncthreads()


@pk.func
def split_values(acts: Ptr[f32], cache_v, vs, sc: i32, part: i32, base: i64, r0: i32,
                 n_cache: i32, has_pos: bool, head_dim: i32):
    """acts[part + d] = sum_r p_r V[r, d] over the split's rows in order (cache rows, then row
    pos from vs): a thread per dimension, V_ROWS rows' loads issued before their adds (the
    last batch's loads clamped to a valid row, their terms skipped)."""
    pv = pk.local_array(f32, V_ROWS)
    vv = pk.local_array(f32, V_ROWS)
    end = r0 + n_cache
    for d in range(pk.thread_idx.x, head_dim, pk.block_dim.x):
        o = f32(0.0)
        r = r0
        while r < end:
            for k in pk.static_range(V_ROWS):
                rk = min(r + k, end - 1)
                pv[k] = acts[sc + rk]
                vv[k] = f32(cache_v[base + i64(rk) * i64(head_dim) + i64(d)])
            for k in pk.static_range(V_ROWS):
                if r + k < end:
                    o += pv[k] * vv[k]
            r += V_ROWS
        if has_pos:
            o += acts[sc + end] * f32(vs[d])
        acts[part + d] = o


@pk.func
def split_softmax(acts: Ptr[f32], sc: i32, r0: i32, r1: i32, scratch):
    """(m, l) of scores r0..r1: their max, and sum exp(s - m) with the exps stored back."""
    t = pk.thread_idx.x
    m = f32(NEG_INF)
    for r in range(r0 + t, r1, pk.block_dim.x):
        if acts[sc + r] > m:
            m = acts[sc + r]
    m = block_max(m, scratch)
    total = f32(0.0)
    for r in range(r0 + t, r1, pk.block_dim.x):
        e = pk.exp(acts[sc + r] - m)
        acts[sc + r] = e
        total += e
    total = block_sum(total, scratch)     # its barriers order the exp stores before the reads
    return m, total


@pk.func
def rotate_head(acts: Ptr[f32], cache_k, cache_v, ff: Ptr[f32, "ro"], qkv: i32, h: i32,
                kvh: i32, pos: i32, has_pos: bool, writer: bool, row: i64, n_head: i32,
                n_head_kv: i32, head_dim: i32, rot_dim: i32, log2_base: f32, qs, ks, vs,
                NEOX: Const[bool], C: Const[pk.dtype]):
    """q_h rotated into qs; with has_pos, the KV head's k rotated and v, both rounded to C,
    into ks / vs (what the cache row pos holds), and by the writer into the cache at row."""
    rope_head(acts + qkv + h * head_dim, qs, pos, head_dim, rot_dim, log2_base, ff, False,
              NEOX, f32, f32(1.0), ff, False, f32(1.0))
    if has_pos:
        rope_head(acts + qkv + (n_head + kvh) * head_dim, ks, pos, head_dim, rot_dim,
                  log2_base, ff, False, NEOX, C, f32(1.0), ff, False, f32(1.0))
        v_src = qkv + (n_head + n_head_kv + kvh) * head_dim
        for d in range(pk.thread_idx.x, head_dim, pk.block_dim.x):
            vs[d] = C(acts[v_src + d])
    pk.syncthreads()
    if has_pos and writer:
        for d in range(pk.thread_idx.x, head_dim, pk.block_dim.x):
            cache_k[row + i64(d)] = ks[d]
            cache_v[row + i64(d)] = vs[d]


@pk.func
def run_split(acts: Ptr[f32], cache_k, cache_v, st: Ptr[i64, "ro"], ff: Ptr[f32, "ro"],
              h: i32, j: i32, pos: i32, n_head: i32, n_head_kv: i32, head_dim: i32,
              n_ctx: i32, kv_base: i64, kv_layer: i64, rot_dim: i32, log2_base: f32,
              scale: f32, scratch, qs, ks, vs, NEOX: Const[bool], C: Const[pk.dtype]):
    """Split j of head h (module docstring): its partials o (head_dim), m, l at st[PART]."""
    n_split = i32(st[N_SPLIT])
    per = split_len(pos, n_split, i32(st[SPLIT_ROWS]))
    r0 = j * per
    if r0 <= pos:
        r1 = min(r0 + per, pos + 1)
        has_pos = r1 == pos + 1
        n_cache = r1 - r0 - (1 if has_pos else 0)
        group = n_head // n_head_kv
        kvh = h // group
        layer_base = kv_base + st[LAYER] * kv_layer + i64(kvh) * i64(n_ctx) * i64(head_dim)
        rotate_head(acts, cache_k, cache_v, ff, i32(st[X]), h, kvh, pos, has_pos,
                    h % group == 0, layer_base + i64(pos) * i64(head_dim), n_head, n_head_kv,
                    head_dim, rot_dim, log2_base, qs, ks, vs, NEOX, C)
        sc = i32(st[W2]) + h * n_ctx
        split_scores(acts, cache_k, qs, ks, sc, layer_base, r0, n_cache, has_pos, head_dim,
                     scale)
        m, total = split_softmax(acts, sc, r0, r1, scratch)
        part = i32(st[PART]) + (h * n_split + j) * (head_dim + 2)
        split_values(acts, cache_v, vs, sc, part + 2, layer_base, r0, n_cache, has_pos,
                     head_dim)
        if pk.thread_idx.x == 0:
            acts[part] = m
            acts[part + 1] = total


@pk.func
def merged_value(acts: Ptr[f32], first: i32, stride: i32, d: i32, n_used: i32, ml) -> f32:
    """sum_j w_j o_j[d] / sum_j w_j l_j over the used splits (weights w_j in ml[j], l_j in
    ml[MAX_SPLITS + j]); one split: o_0[d] / l_0, the unsplit arithmetic. MERGE_BATCH partials'
    loads are issued before their adds."""
    if n_used == 1:
        return acts[first + 2 + d] / ml[MAX_SPLITS]
    total = f32(0.0)
    for j in range(n_used):
        total += ml[MAX_SPLITS + j] * ml[j]
    o = f32(0.0)
    ov = pk.local_array(f32, MERGE_BATCH)
    j0 = 0
    while j0 < n_used:
        for k in pk.static_range(MERGE_BATCH):
            ov[k] = acts[first + 2 + min(j0 + k, n_used - 1) * stride + d]
        for k in pk.static_range(MERGE_BATCH):
            if j0 + k < n_used:
                o += ov[k] * ml[j0 + k]
        j0 += MERGE_BATCH
    return o / total


@pk.func
def merge_head(acts: Ptr[f32], xq: Ptr[u32], st: Ptr[i64, "ro"], h: i32, n_used: i32,
               head_dim: i32, ml):
    """The last split of head h to arrive: the output of its n_used splits (acts at st[Y] + h
    head_dim) and, when st[XQ] >= 0, its Q8_1 blocks (head_dim a multiple of 32); n_used 0 (a
    position outside the cache): NaN."""
    t = pk.thread_idx.x
    first = i32(st[PART]) + h * i32(st[N_SPLIT]) * (head_dim + 2)
    if t < n_used:                    # m_j, l_j: one load round for all the splits
        ml[t] = acts[first + t * (head_dim + 2)]
        ml[MAX_SPLITS + t] = acts[first + t * (head_dim + 2) + 1]
    pk.syncthreads()
    big = f32(NEG_INF)
    for j in range(n_used):
        big = max(big, ml[j])
    pk.syncthreads()
    if t < n_used:
        ml[t] = pk.exp(ml[t] - big)
    pk.syncthreads()
    lane = t % 32
    y = i32(st[Y]) + h * head_dim
    for d0 in range(t - lane, head_dim, pk.block_dim.x):      # warp-uniform: a warp a block
        d = d0 + lane
        v = f32(NAN)
        if d < head_dim:
            if n_used > 0:
                v = merged_value(acts, first, head_dim + 2, d, n_used, ml)
            acts[y + d] = v
        if st[XQ] >= 0:
            store_q8_1_block(v, lane, xq + i32(st[XQ]), (h * head_dim + d0) // 32)


@pk.func
def run_attention_item(acts: Ptr[f32], xq: Ptr[u32], cache_k, cache_v, counters: Ptr[u32],
                       st: Ptr[i64, "ro"], ff: Ptr[f32, "ro"], lo: i32, head_counter0: i32,
                       pos: i32, n_head: i32, n_head_kv: i32, head_dim: i32, n_ctx: i32,
                       kv_base: i64, kv_layer: i64, rot_dim: i32, log2_base: f32, scale: f32,
                       scratch, qs, ks, vs, ml, flag, NEOX: Const[bool], C: Const[pk.dtype]):
    """ATTN item lo = h n_split + j. A split with rows (j < n_used, known to every item from
    pos) runs, counts itself on head h's counter (counters[head_counter0 + h]) and merges if
    it was the last of the n_used; a split past the last row does nothing, so the merge never
    waits for a block that had nothing to do. A position outside the cache: split 0 alone
    arrives, and its merge writes NaN."""
    n_split = i32(st[N_SPLIT])
    h = lo // n_split
    valid = pos >= 0 and pos < n_ctx
    n_used = 1
    if valid:
        per = split_len(pos, n_split, i32(st[SPLIT_ROWS]))
        n_used = (pos + per) // per
    if lo % n_split < n_used:                 # block-uniform
        if valid:
            run_split(acts, cache_k, cache_v, st, ff, h, lo % n_split, pos, n_head, n_head_kv,
                      head_dim, n_ctx, kv_base, kv_layer, rot_dim, log2_base, scale, scratch,
                      qs, ks, vs, NEOX, C)
        pk.syncthreads()             # the partials' stores before thread 0's release
        if pk.thread_idx.x == 0:
            old = pk.atomic_add(counters, head_counter0 + h, u32(1), order="acq_rel")
            flag[0] = 1 if old == u32(n_used - 1) else 0
        pk.syncthreads()             # the acquire in it orders the merge's reads
        if flag[0] != 0:
            merge_head(acts, xq, st, h, n_used if valid else 0, head_dim, ml)
            if pk.thread_idx.x == 0:     # every used split has arrived: ready for reuse
                pk.store_relaxed(counters, head_counter0 + h, u32(0))
