"""Decode attention on tensor cores with K/V staged through shared memory (f16 cache, head_dim a
multiple of 32): decode_mma's math, with its register ring replaced by a per-warp ring of S
tiles in dynamic shared memory filled by `cp.async`.

Input/output: as decode_mma (same parameters and partial format); dynamic shared memory of
`staged_shared_bytes(D, NWARPS, S)` bytes at launch.

Why: decode_mma keeps its ring in registers (242 per thread with two tiles at head_dim 128), so
one block fits per SM and only two tiles per warp are in flight. Copies into shared memory cost
no registers: a ring of S tiles per warp (all of a short split's keys) is in flight at once, and
under PDL with EARLY_KV they are issued before `griddepcontrol.wait`, while the previous kernel
still runs; the registers left (~130) let blocks of the next launch become resident early.

Each lane copies exactly the 16-byte chunks it later reads (decode_mma.load_tile's pattern:
rows g and g + 8 of the tile, halves 32p + 8t .. + 7), into its own consecutive 16 bytes per
chunk (lane-major, so the reads are conflict-free), so its own `cp.async.wait_group` is all
the synchronisation a tile needs. One commit group per tile (empty past the split), so
`cp_async_wait(S - 1)` before tile i means tile i has landed. EARLY_KV: before the wait a lane
copies its rows up to early_last_key (rows the previous kernel does not write); after it, the
rest (the last split's newest rows) in one more group, and the first tile waits for every
group.
"""
import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64, u16, u32

from .decode_combine import NEG_INIT
from .decode_kernels import begin_block, block_work, combine_if_last, early_last_key
from .decode_mma import accumulate_tile, load_q, merge_warps, score_tile

CHUNK_WORDS = 4              # u32 words per 16-byte chunk


def staged_shared_bytes(head_dim: int, warps: int, stages: int) -> int:
    """Dynamic shared memory of decode_staged: per warp and ring tile, K and V chunks of 16
    rows (32 lanes x 2 rows x head_dim / 32 chunks of 16 bytes each)."""
    return warps * stages * 2 * (2 * (head_dim // 32) * 32 * 16)


@pk.func
def copy_tile(kp, vp, ring, at0: i32, key0: i32, early_last: i32, last_key: i32, g: i32,
              t: i32, lane: i32, LATE: Const[int], D: Const[int], NP: Const[int]):
    """cp.async of this lane's chunks of K/V rows key0 + g, key0 + 8 + g (clamped to last_key)
    into the ring slot at word at0: the rows up to early_last (LATE = 0) or past it (LATE = 1)."""
    for j in pk.static_range(2):
        raw = key0 + 8 * j + g
        take = raw > early_last if LATE else raw <= early_last
        if take:
            key = min(raw, last_key)
            for p in pk.static_range(NP):
                src = i64(key) * i64(D // 2) + i64(16 * p + 4 * t)
                at = at0 + (j * NP + p) * 32 * CHUNK_WORDS + lane * CHUNK_WORDS
                pk.cp_async(ring, at, kp, src, 16)
                pk.cp_async(ring, at + 2 * NP * 32 * CHUNK_WORDS, vp, src, 16)


@pk.func
def read_tile(ring, kb, vb, at0: i32, lane: i32, NP: Const[int]):
    """This lane's chunks of a landed slot into registers, in decode_mma's ring-slot-0 order."""
    for j in pk.static_range(2):
        for p in pk.static_range(NP):
            at = at0 + (j * NP + p) * 32 * CHUNK_WORDS + lane * CHUNK_WORDS
            kw = pk.load_vec(ring, at, 4)
            vw = pk.load_vec(ring, at + 2 * NP * 32 * CHUNK_WORDS, 4)
            for w in pk.static_range(4):
                kb[(j * NP + p) * 4 + w] = kw[w]
                vb[(j * NP + p) * 4 + w] = vw[w]


@pk.func
def fill_staged_ring(kp, vp, ring, ring0: i32, first: i32, stride: i32, k0: i32, k1: i32,
                     kv_len: i32, g: i32, t: i32, lane: i32, D: Const[int], NP: Const[int],
                     S: Const[int], EARLY_KV: Const[int]):
    """The ring's S tiles, one commit group each, and the wait for the previous kernel
    (EARLY_KV: the wait is here, after the early rows' copies; the late rows follow it in one
    more group)."""
    last_key = max(0, k1 - 1)
    slot_words = 4 * NP * 32 * CHUNK_WORDS
    early_last = early_last_key(k0, k1, kv_len, EARLY_KV)
    if EARLY_KV:
        for s in pk.static_range(S):
            if first + s * stride < k1:
                copy_tile(kp, vp, ring, ring0 + s * slot_words, first + s * stride, early_last,
                          last_key, g, t, lane, 0, D, NP)
            pk.cp_async_commit()
        pk.grid_dependency_wait()
    for s in pk.static_range(S):
        key0 = first + s * stride
        if key0 < k1 and key0 + 15 > early_last:
            copy_tile(kp, vp, ring, ring0 + s * slot_words, key0, early_last, last_key, g, t,
                      lane, 1, D, NP)
        if not EARLY_KV:
            pk.cp_async_commit()
    if EARLY_KV:
        pk.cp_async_commit()


@pk.kernel
def decode_staged(q: Ptr[f32, "ro"], k_cache: Ptr[u32, "ro"], v_cache: Ptr[u32, "ro"],
                  k_scale: Ptr[u16, "ro"], v_scale: Ptr[u16, "ro"], lens: Ptr[i32, "ro"],
                  lens_stride: i32, len_add: i32, len_step: i32,
                  cache_z_stride: i64, max_len: i32, n_head: i32, n_kv_head: i32,
                  q_scale: f32, softcap: f32, window: i32, direct: i32,
                  out: Ptr[f32], part_o: Ptr[f32], part_ml: Ptr[f32], counters: Ptr[i32],
                  D: Const[int], GB: Const[int], NWARPS: Const[int], S: Const[int],
                  FUSED: Const[int], SG: Const[int], TPG: Const[int], MAXS: Const[int],
                  UNR: Const[int], TRIGGER: Const[int], EARLY_KV: Const[int]):
    NP = D // 32
    lane = pk.lane_id()
    warp = pk.thread_idx.x // 32
    g = lane // 4
    t = lane % 4
    begin_block(TRIGGER, EARLY_KV)
    z, split, kvh, h0, k0, k1, kv_len = block_work(lens, lens_stride, len_add, len_step, window,
                                                   n_head, n_kv_head, GB)
    first_elem = i64(z) * cache_z_stride + i64(kvh) * i64(max_len) * i64(D)
    kp = k_cache + first_elem // 2                   # u32 words of f16 pairs
    vp = v_cache + first_elem // 2
    last_key = max(0, k1 - 1)
    ring = pk.dynamic_shared(u32)
    slot_words = 4 * NP * 32 * CHUNK_WORDS           # K and V chunks of one tile
    ring0 = warp * S * slot_words
    stride = NWARPS * 16                             # keys of one ring step of the whole block
    first = k0 + warp * 16
    fill_staged_ring(kp, vp, ring, ring0, first, stride, k0, k1, kv_len, g, t, lane, D, NP, S,
                     EARLY_KV)

    qb = pk.local_array(u32, NP * 4)                 # B fragments of Q^T (f16 pairs)
    dq = pk.local_array(f32, NP * 2)                 # unused (Q8 only)
    load_q(q, qb, dq, q_scale, (z * n_head + h0 + g) * D, g < GB, t, NP, 0)
    oacc = pk.local_array(f32, NP * 8)
    for i in pk.static_range(NP * 8):
        oacc[i] = 0.0
    m = pk.local_array(f32, 2)
    den = pk.local_array(f32, 2)
    for e in pk.static_range(2):
        m[e] = NEG_INIT
        den[e] = 0.0
    s = pk.local_array(f32, 4)
    kb = pk.local_array(u32, 2 * NP * 4)             # the tile being scored
    vb = pk.local_array(u32, 2 * NP * 4)
    ksc = pk.local_array(u16, 2 * NP)                # unused (Q8 only)
    base = first
    while base < k1:
        for p in pk.static_range(S):
            key0 = base + p * stride
            wait_all = False                         # EARLY_KV: the late rows' group is
            if EARLY_KV:                             # the newest, so tile 0 waits for all
                if p == 0:
                    wait_all = base == first
            if wait_all:
                pk.cp_async_wait(0)
            else:
                pk.cp_async_wait(S - 1)
            if key0 < k1:
                read_tile(ring, kb, vb, ring0 + p * slot_words, lane, NP)
                score_tile(kb, ksc, qb, dq, 0, key0, k1, g, softcap, s, NP, 0)
                accumulate_tile(vb, ksc, s, m, den, oacc, 0, NP, 0)
            if key0 + S * stride < k1:               # refill the slot S tiles ahead
                copy_tile(kp, vp, ring, ring0 + p * slot_words, key0 + S * stride, -1,
                          last_key, g, t, lane, 1, D, NP)
            pk.cp_async_commit()
        base += S * stride
    merge_warps(oacc, m, den, warp, g, t, z, h0, split, n_head, direct, out, part_o, part_ml,
                D, GB, NWARPS, NP)
    if FUSED:
        combine_if_last(counters, part_o, part_ml, out, z, h0, n_head, direct, GB, D, NWARPS,
                        SG, TPG, MAXS, UNR)
