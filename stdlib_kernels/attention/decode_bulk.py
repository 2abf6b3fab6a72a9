"""Decode attention on tensor cores with the split's K/V rows brought into shared memory by bulk
copies (sm_90+; the CPU target emulates them): decode_mma's math, another way to feed it.

Input/output: decode_mma's (same parameters but the Q8_0 scales, same partial format, so the host
switches kernels without touching the combine); an f16 cache only.

Why: decode_mma keeps its loads in flight in a register ring, so a block has at most one tile
per warp in the air before the PDL wait and needs ~240 registers per thread (one block of 8
warps per SM). Here each warp owns a ring of S stages in dynamic shared memory, one 16-key tile
(K rows, then V rows) per stage, filled by lane 0 with two `cp.async.bulk` copies (one per
cache: a tile's rows of one KV head are contiguous). With EARLY_KV every stage of the ring is
requested before `pk.grid_dependency_wait()` (rows before the newest, kv_len - 1; the newest
row after the wait into the same stage: its bytes count toward the same mbarrier phase), and
the copy engine reads through L2, so no line of a row the previous kernel writes can be stale.
Few registers (small 4-warp blocks, three per SM by the launch bounds) and S x 8 KB of shared
memory per warp let the next decode's blocks become resident while this one's still stream:
in a PDL chain its copies are in flight before this one finishes.

Fragments come from shared memory exactly as decode_mma loads them from global memory (lane
(g, t): 16 bytes of rows g and g + 8, halves 32p + 8t .. + 7), then decode_mma's score_tile /
accumulate_tile / merge_warps run unchanged on ring slot 0. Rows past the split's end are not
copied: their (stale) K scores are masked, and their V words are zeroed (stale bytes could be
NaN, and 0 * NaN is NaN in the P V product).
"""
import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64, u32

from .._device import init_warp_mbarriers
from .decode_kernels import begin_block, block_work, combine_if_last
from .decode_mma import accumulate_tile, clear_state, load_q, merge_warps, score_tile

TILE = 16                    # keys per warp per stage (the mma's 16 rows)


@pk.func
def issue_rows(kp, vp, sm, bars, bar: i32, stage: i32, row_words: i32, key0: i32, lo: i32,
               hi: i32):
    """Copy rows [lo, hi) of the tile starting at key0 into its stage (K rows at `stage`, V rows
    TILE rows later); the bytes count toward mbarrier `bar`. Lane 0 only."""
    if hi > lo:
        nbytes = (hi - lo) * row_words * 4
        at = stage + (lo - key0) * row_words
        pk.bulk_copy(sm, at, kp, lo * row_words, nbytes, bars, bar)
        pk.bulk_copy(sm, at + TILE * row_words, vp, lo * row_words, nbytes, bars, bar)


@pk.func
def stage_fragments(sm, stage: i32, row_words: i32, kb, vb, key0: i32, k1: i32, g: i32, t: i32,
                    NP: Const[int]):
    """This lane's K / V words of tile rows g and g + 8 from shared memory into ring slot 0 of
    kb / vb (decode_mma.load_row's layout); V of rows at or past k1 as zeros."""
    for j in pk.static_range(2):
        row = stage + (g + 8 * j) * row_words
        live = key0 + g + 8 * j < k1
        for p in pk.static_range(NP):
            at = (j * NP + p) * 4
            kw = pk.load_vec(sm, row + 16 * p + 4 * t, 4)
            vw = pk.load_vec(sm, row + TILE * row_words + 16 * p + 4 * t, 4)
            for w in pk.static_range(4):
                kb[at + w] = kw[w]
                vb[at + w] = vw[w] if live else u32(0)


@pk.kernel(max_threads=128, min_blocks=3)
def decode_bulk(q: Ptr[f32], k_cache: Ptr[u32, "ro"], v_cache: Ptr[u32, "ro"],
                lens: Ptr[i32, "ro"], lens_stride: i32, len_add: i32, len_step: i32,
                cache_z_stride: i64, max_len: i32, n_head: i32, n_kv_head: i32,
                q_scale: f32, softcap: f32, window: i32, direct: i32,
                out: Ptr[f32], part_o: Ptr[f32], part_ml: Ptr[f32], counters: Ptr[i32],
                xq: Ptr[u32], D: Const[int], GB: Const[int], NWARPS: Const[int], S: Const[int],
                FUSED: Const[int], SG: Const[int], TPG: Const[int], MAXS: Const[int],
                UNR: Const[int], TRIGGER: Const[int], EARLY_KV: Const[int],
                Q8OUT: Const[int], sinks: Ptr[f32, "ro"], SINK: Const[int]):
    NP = D // 32
    row_words = D // 2                               # f16 pairs per cache row
    lane = pk.lane_id()
    warp = pk.thread_idx.x // 32
    g = lane // 4
    t = lane % 4
    sm = pk.dynamic_shared(u32)                      # NWARPS x S stages of 2 x TILE rows
    bars = pk.shared_array(pk.u64, NWARPS * S)
    init_warp_mbarriers(bars, warp, lane, S)
    begin_block(TRIGGER, EARLY_KV)
    z, split, kvh, h0, k0, k1, kv_len = block_work(lens, lens_stride, len_add, len_step, window,
                                                   n_head, n_kv_head, GB)
    first_word = (i64(z) * cache_z_stride + i64(kvh) * i64(max_len) * i64(D)) // 2
    kp = k_cache + first_word
    vp = v_cache + first_word
    stage_words = 2 * TILE * row_words
    ring = warp * S * stage_words
    step = NWARPS * TILE                             # keys between a warp's tiles
    first = k0 + warp * TILE
    tiles = 0
    if first < k1:
        tiles = (k1 - first + step - 1) // step
    # the ring's first S tiles: rows before `newest` now (EARLY_KV: before the wait), the rest
    # after the wait
    newest = kv_len - 1 if EARLY_KV else kv_len
    if lane == 0:
        for s in pk.static_range(S):
            if s < tiles:
                key0 = first + s * step
                end = min(key0 + TILE, k1)
                pk.mbarrier_arrive_expect_tx(bars, warp * S + s, 2 * (end - key0) * row_words * 4)
                issue_rows(kp, vp, sm, bars, warp * S + s, ring + s * stage_words, row_words,
                           key0, key0, min(end, newest))
    if EARLY_KV:
        pk.grid_dependency_wait()
        if lane == 0:
            for s in pk.static_range(S):
                if s < tiles:
                    key0 = first + s * step
                    end = min(key0 + TILE, k1)
                    issue_rows(kp, vp, sm, bars, warp * S + s, ring + s * stage_words,
                               row_words, key0, max(key0, newest), end)

    qb = pk.local_array(u32, NP * 4)
    dq = pk.local_array(f32, NP * 2)                 # unused (f16 cache)
    load_q(q, qb, dq, q_scale, (z * n_head + h0 + g) * D, g < GB, t, NP, 0)
    oacc = pk.local_array(f32, NP * 8)
    m = pk.local_array(f32, 2)
    den = pk.local_array(f32, 2)
    clear_state(oacc, m, den, NP)
    s_tile = pk.local_array(f32, 4)
    kb = pk.local_array(u32, 2 * NP * 4)
    vb = pk.local_array(u32, 2 * NP * 4)
    ksc = pk.local_array(pk.u16, 2 * NP)             # unused (Q8_0 scales in decode_mma)
    vsc = pk.local_array(pk.u16, 2 * NP)
    for i in range(tiles):
        slot = i % S
        stage = ring + slot * stage_words
        key0 = first + i * step
        pk.mbarrier_wait(bars, warp * S + slot, (i // S) % 2)
        stage_fragments(sm, stage, row_words, kb, vb, key0, k1, g, t, NP)
        pk.syncwarp()                                # every lane has read the stage
        nxt = i + S
        if lane == 0 and nxt < tiles:                # refill it with tile i + S (after the wait)
            key1 = first + nxt * step
            end = min(key1 + TILE, k1)
            pk.mbarrier_arrive_expect_tx(bars, warp * S + slot, 2 * (end - key1) * row_words * 4)
            issue_rows(kp, vp, sm, bars, warp * S + slot, stage, row_words, key1, key1, end)
        score_tile(kb, ksc, qb, dq, 0, key0, k1, g, softcap, s_tile, NP, 0)
        accumulate_tile(vb, vsc, s_tile, m, den, oacc, 0, NP, 0)
    merge_warps(oacc, m, den, warp, g, t, z, h0, split, n_head, direct, out, part_o, part_ml,
                xq, sinks, D, GB, NWARPS, NP, Q8OUT, 0, SINK)
    if FUSED:
        combine_if_last(counters, part_o, part_ml, out, z, h0, n_head, direct, sinks, GB, D,
                        NWARPS, SG, TPG, MAXS, UNR, SINK)
