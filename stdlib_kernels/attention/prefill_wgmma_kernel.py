"""The kernel of prefill attention on Hopper's wgmma (FlashAttention-3's structure; the host side
is prefill_wgmma.py): causal attention of a block of new tokens against an f16 KV cache that
already holds their own keys and values. sm_90a; the CPU target emulates it.

Input: q (tokens, W) f32, token i's heads in its first n_head * D values, query i at position
start = start0 + start_at[0] (+ i); K / V caches (n_kv_head, max_len, D) f16 as TMA tensor maps
(boxes of 1 x BN keys x 64 dims, 128-byte swizzle); out (tokens, n_head, D) f32.

Work split: grid (row blocks, n_kv_head); a block's 128 rows are (token, head) pairs of one KV
head's query group (row r -> token r // group, head r % group, as prefill_flash), so the group
shares every K / V tile. 384 threads: warpgroup 0 produces (thread 0 TMA-loads the tiles of
BN keys into a ring of STAGES stages; K and V of a stage complete on barriers of their own, so
S = Q K^T starts before V has landed), warpgroups 1 and 2 consume, 64 rows each:

    S (64 x BN, f32) = Q K^T     wgmma, Q's f16 A fragments in registers (loaded once, scaled
                                 by scale * log2 e), K K-major from the stage
    mask, softcap, online softmax in the log2 domain, in registers (prefill_flash's)
    O (64 x D, f32) += P V       wgmma, P's A fragments packed from S, V N-major (trans_b: the
                                 cache's keys x dims rows as TMA wrote them)

then every consumer thread arrives on the stage's empty barrier, and at the end O / l is
stored. The last tile is loaded at keys kv_hi - BN .. kv_hi - 1 (the block's last visible key
ends it), so no tile reads cache rows past the prompt (stale or never written: 0 x NaN would
poison O); its keys below the nominal tile start, already counted, are masked, and keys below
0 (a short context) are TMA's zero fill, masked too.

    shared (dynamic): [pad to 1024 B] stage 0: K (D / 64 boxes of BN x 128 B) | V (the same),
                      stage 1, ...
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64, u32, u64

from ..gemm_hopper_kernel import swizzle_base
from .decode_combine import with_sink
from .decode_kernels import NEG_INIT
from .prefill_flash import finish_scores, load_q

ROWS = 128                          # query rows of a block: 2 consumer warpgroups x 64
THREADS = 384
BOX_DIMS = 64                       # head dims per TMA box: 128 bytes, the swizzle's width
PRODUCER_REGS, CONSUMER_REGS = 40, 232   # 128 x 40 + 256 x 232 = 384 x 168, the block's
#                                         registers (pk.entry_registers(384, 1))


@pk.func
def tile_key(j: i32, kv_lo: i32, kv_hi: i32, BN: Const[int]) -> i32:
    """The first key of tile j: kv_lo + j BN, except the last tile, which ends at kv_hi."""
    return min(kv_lo + j * BN, kv_hi - BN)


@pk.func
def produce(smem, base: i32, bars, tk, tv, kvh: i32, kv_lo: i32, kv_hi: i32, n_tiles: i32,
            D: Const[int], BN: Const[int], STAGES: Const[int]):
    """Thread 0 of the producer: tile j's K boxes into stage j % STAGES (completing on
    full_k), then its V boxes (on full_v), once the consumers emptied the stage."""
    box = BN * BOX_DIMS                               # elements of one box
    for j in range(n_tiles):
        s = j % STAGES
        if j >= STAGES:
            pk.mbarrier_wait(bars, 2 * STAGES + s, (j // STAGES - 1) % 2)
        kt = tile_key(j, kv_lo, kv_hi, BN)
        at = base + s * 2 * BN * D
        pk.mbarrier_arrive_expect_tx(bars, s, BN * D * 2)
        for c in pk.static_range(D // BOX_DIMS):
            pk.tma_load(smem, at + c * box, tk, (kvh, kt, c * BOX_DIMS), bars, s)
        pk.mbarrier_arrive_expect_tx(bars, STAGES + s, BN * D * 2)
        for c in pk.static_range(D // BOX_DIMS):
            pk.tma_load(smem, at + BN * D + c * box, tv, (kvh, kt, c * BOX_DIMS), bars,
                        STAGES + s)


@pk.func
def scores(sacc, qf, smem, k_at: i32, D: Const[int], BN: Const[int]):
    """sacc (64 x BN) = Q K^T: D / 16 k16 steps, Q's fragments from qf, K's rows (keys) 128
    bytes apart in 8-row atoms of 1024 (sbo), a k step 32 bytes on inside a box."""
    frag = pk.local_array(u32, 4)
    pk.wgmma_fence()
    for ks in pk.static_range(D // 16):
        for w in pk.static_range(4):
            frag[w] = qf[ks * 4 + w]
        dk = pk.wgmma_desc(smem, k_at + (ks // 4) * BN * BOX_DIMS, 16, 1024, 128)
        pk.wgmma(sacc, frag, dk + u64(2 * (ks % 4)), "f16", ks > 0)
    pk.wgmma_commit_group()
    pk.wgmma_wait_group(0, sacc)


@pk.func
def softmax_tile(sacc, oacc, m, l, D: Const[int], BN: Const[int]):
    """Per row (this thread's two: g, g + 8): the running max over the tile, scores ->
    exp2(s - max), the denominator and O's row rescaled (skipped, warp-uniformly, when no row's
    max grew). The 4 lanes of a quad share a row."""
    corr = pk.local_array(f32, 2)
    grew = False
    for r in pk.static_range(2):
        mx = m[r]
        for nt in pk.static_range(BN // 8):
            mx = max(mx, max(sacc[nt * 4 + 2 * r], sacc[nt * 4 + 2 * r + 1]))
        for k in pk.static_range(2):
            mx = max(mx, pk.shfl_xor(mx, 1 << k))
        corr[r] = pk.fast.exp2(m[r] - mx)
        grew = grew or mx > m[r]
        m[r] = mx
        total = f32(0.0)
        for nt in pk.static_range(BN // 8):
            for e in pk.static_range(2):
                i = nt * 4 + 2 * r + e
                sacc[i] = pk.fast.exp2(sacc[i] - mx)
                total += sacc[i]
        l[r] = l[r] * corr[r] + total
    if pk.any_sync(grew):
        for dt in pk.static_range(D // 8):
            for e in pk.static_range(4):
                oacc[dt * 4 + e] *= corr[e // 2]


@pk.func
def accumulate_pv(oacc, sacc, smem, v_at: i32, D: Const[int], BN: Const[int]):
    """oacc (64 x D) += P V: per 16 keys, P's A fragment packed from the scores (the
    accumulator layout of S is the A-fragment layout), V read N-major: 64-dim boxes lbo = BN x
    128 bytes apart, 8-key atoms sbo = 1024 apart, 16 keys 2048 bytes on."""
    pf = pk.local_array(u32, 4)
    pk.wgmma_fence()
    for kk in pk.static_range(BN // 16):
        for w in pk.static_range(4):
            pf[w] = pk.pack_f16x2(sacc[kk * 8 + 2 * w], sacc[kk * 8 + 2 * w + 1])
        dv = pk.wgmma_desc(smem, v_at + kk * 16 * BOX_DIMS, BN * 2 * BOX_DIMS, 1024, 128)
        pk.wgmma(oacc, pf, dv, "f16", 1, trans_b=True)
    pk.wgmma_commit_group()
    pk.wgmma_wait_group(0, oacc)


@pk.func
def store_rows(out, oacc, l, m, row0: i32, n_rows: i32, group: i32, n_head: i32, kvh: i32,
               sinks, D: Const[int], SINK: Const[bool]):
    """O / l of this thread's rows row0, row0 + 8 (those below n_rows) into out."""
    t = pk.lane_id() % 4
    for r in pk.static_range(2):
        total = l[r]
        for k in pk.static_range(2):
            total += pk.shfl_xor(total, 1 << k)
        row = row0 + 8 * r
        if SINK:
            total = with_sink(total, m[r], sinks, kvh * group + row % group, SINK)
        inv = 1.0 / total
        if row < n_rows:
            base = i64(((row // group) * n_head + kvh * group + row % group) * D + 2 * t)
            for dt in pk.static_range(D // 8):
                out[base + dt * 8] = oacc[dt * 4 + 2 * r] * inv
                out[base + dt * 8 + 1] = oacc[dt * 4 + 2 * r + 1] * inv


@pk.func
def consume(smem, base: i32, bars, q, out, tokens: i32, q_row: i32, start: i32, n_head: i32,
            group: i32, kvh: i32, block: i32, q_scale: f32, softcap: f32, window: i32,
            kv_lo: i32, kv_hi: i32, n_tiles: i32, sinks, D: Const[int], BN: Const[int],
            STAGES: Const[int], SINK: Const[bool]):
    """A consumer warpgroup: its 64 rows' Q, every tile's S, softmax and P V, the store."""
    t = pk.thread_idx.x
    lane = pk.lane_id()
    n_rows = tokens * group
    wg_row = block * ROWS + (t // 128 - 1) * 64           # the warpgroup's first row
    row0 = wg_row + ((t % 128) // 32) * 16 + lane // 4    # this thread's rows: row0, + 8
    pos = pk.local_array(i32, 2)       # the rows' positions and lowest invisible keys
    lo = pk.local_array(i32, 2)
    lo_t = pk.local_array(i32, 2)      # ... and per tile, with the keys counted before
    for r in pk.static_range(2):
        pos[r] = start + (row0 + 8 * r) // group
        lo[r] = pos[r] - window if window > 0 else -1
    first_pos = start + wg_row // group
    qf = pk.local_array(u32, D // 4)
    load_q(q, qf, i64(0), row0, n_rows, group, q_row, kvh, lane % 4, q_scale, D, 1)
    oacc = pk.local_array(f32, D // 2)
    for i in pk.static_range(D // 2):
        oacc[i] = 0.0
    m = pk.local_array(f32, 2)
    l = pk.local_array(f32, 2)
    for r in pk.static_range(2):
        m[r] = NEG_INIT
        l[r] = 0.0
    sacc = pk.local_array(f32, BN // 2)
    for j in range(n_tiles):
        s = j % STAGES
        phase = (j // STAGES) % 2
        nominal = kv_lo + j * BN
        kt = tile_key(j, kv_lo, kv_hi, BN)
        at = base + s * 2 * BN * D
        pk.mbarrier_wait(bars, s, phase)                  # K landed
        scores(sacc, qf, smem, at, D, BN)
        for r in pk.static_range(2):     # lo <= pos: finish_scores' one unsigned compare
            lo_t[r] = min(max(lo[r], nominal - 1), pos[r])
        finish_scores(sacc, kt, lane % 4, pos, lo_t, softcap,
                      kt + BN - 1 > first_pos or window > 0 or kt != nominal, BN, 1)
        softmax_tile(sacc, oacc, m, l, D, BN)
        pk.mbarrier_wait(bars, STAGES + s, phase)         # V landed
        accumulate_pv(oacc, sacc, smem, at + BN * D, D, BN)
        pk.mbarrier_arrive(bars, 2 * STAGES + s)          # the stage may be refilled
    store_rows(out, oacc, l, m, row0, n_rows, group, n_head, kvh, sinks, D, SINK)


# launch bounds: 384 threads start with 65536 / 384 = 168 registers each, which setmaxnreg
# moves from the producer to the consumers
@pk.kernel(max_threads=THREADS, min_blocks=1)
def prefill_wgmma(tk: pk.TensorMap, tv: pk.TensorMap, q: Ptr[f32, "ro"], out: Ptr[f32],
                  tokens: i32, q_row: i32, start0: i32, start_at: Ptr[i32, "ro"], n_head: i32,
                  n_kv_head: i32, q_scale: f32, softcap: f32, window: i32,
                  sinks: Ptr[f32, "ro"], D: Const[int], BN: Const[int], STAGES: Const[int],
                  SINK: Const[bool]):
    """grid (ceil(tokens * group / 128), n_kv_head), 384 threads; see the module docstring.
    q_scale: scale * log2 e (scale alone with a softcap, which finish_scores applies in the
    natural domain); window 0: none; sinks: (n_head,) f32 when SINK, else unused."""
    # full_k[s] = bars[s], full_v[s] = bars[S + s], empty[s] = bars[2 S + s]
    bars = pk.shared_array(u64, 3 * STAGES)
    smem = pk.dynamic_shared(pk.u16)
    # the stages start at the first 1024-byte-aligned shared address (the swizzle's repeat)
    base = swizzle_base(smem)
    t = pk.thread_idx.x
    if t == 0:
        for s in pk.static_range(STAGES):
            pk.mbarrier_init(bars, s, 1)                  # the producer's expect-tx arrivals
            pk.mbarrier_init(bars, STAGES + s, 1)
            pk.mbarrier_init(bars, 2 * STAGES + s, 256)   # every consumer thread
        pk.fence_mbarrier_init()
    pk.syncthreads()
    start = start0 + start_at[0]            # device part: graphs replay at new starts
    kvh = pk.block_idx.y
    group = n_head // n_kv_head
    block = pk.grid_dim.x - 1 - pk.block_idx.x          # heaviest (latest) rows first
    first_tok = (block * ROWS) // group
    last_tok = min(tokens * group - 1, (block + 1) * ROWS - 1) // group
    kv_hi = start + last_tok + 1                          # keys the block's rows see
    kv_lo = max(0, start + first_tok - window + 1) if window > 0 else 0
    n_tiles = (kv_hi - kv_lo + BN - 1) // BN
    if t < 128:
        pk.setmaxnreg_dec(PRODUCER_REGS)
        if t == 0:
            produce(smem, base, bars, tk, tv, kvh, kv_lo, kv_hi, n_tiles, D, BN, STAGES)
    else:
        pk.setmaxnreg_inc(CONSUMER_REGS)
        consume(smem, base, bars, q, out, tokens, q_row, start, n_head, group, kvh, block,
                q_scale, softcap, window, kv_lo, kv_hi, n_tiles, sinks, D, BN, STAGES, SINK)
