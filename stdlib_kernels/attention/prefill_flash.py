"""Prefill attention on tensor cores, FlashAttention-2 style, with K/V tiles streamed into shared
memory by `cp.async` (a ring of stages) and mma fragments read by `pk.ldmatrix`.

Input: q (tokens, n_head, D) f32 (query i sits at position start + i, start = start0 +
start_at[0]: a host part and a device part, so a captured graph replays at new positions);
K/V cache viewed as u32
pairs of f16, (n_kv_head, max_len, D / 2), holding positions 0 .. start + tokens - 1.
Output: out (tokens, n_head, D) f32.

Several sequences in one launch (VARLEN): grid z is the sequence, and its 4 ints in `seqs`
(first token row of q / out, tokens, first position, slot of a pool cache (slots, n_kv_head,
max_len, D / 2)) replace tokens, start and the cache; grid x covers the longest, and the
blocks past a shorter one's rows return at once.

Work split: grid (row blocks, n_kv_head). A block's 16 * MT * NWARPS rows are (token, head)
pairs of one KV head's query group (row r -> token r // group, head r % group), so the group
shares every K/V tile; each warp owns MT 16-row m-tiles, their Q as f16 A fragments in
registers. Every K/V fragment a warp loads serves its MT m-tiles: with MT = 2 a tile costs half
the shared-memory reads per mma, which is what bounds MT = 1 (one ldmatrix per two mma).
Per tile of BN keys (a ring of STAGES shared-memory stages: tiles j + 1 .. j + STAGES - 1 in
flight while tile j is computed, one barrier per tile): S = Q K^T by mma with K's B fragments
from `ldmatrix` (K row-major = B column-major), masking only where the tile crosses the
causal diagonal or a window, the online softmax in the log2 domain, and O += P V with P's A
fragments taken from the score accumulators and V's B fragments from `ldmatrix(trans=True)` on
the row-major V tile (no transposing stores). Rows are padded by 8 halves, so the 8 rows of
every ldmatrix tile fall in distinct banks.
No tokens x tokens matrix is ever stored. With SINK, head h's sink logit sinks[h] (gpt-oss)
joins each row's denominator at the final normalisation.
"""
import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64, u32

from .decode_combine import with_sink
from .decode_kernels import LOG2E, MASKED, NEG_INIT


@pk.func
def issue_tile(kv_smem, k32, v32, cache: i64, kt: i32, kv_hi: i32, tid: i32, D: Const[int],
               BN: Const[int], NT: Const[int]):
    """cp.async of keys kt .. kt + BN - 1 (rows past kv_hi repeat row kv_hi - 1; they are
    masked) into one stage: K rows then V rows, RSW words apart."""
    RSW = D // 2 + 4
    CPR = D // 8                                   # 16-byte chunks per row
    for i in pk.static_range((BN * CPR + NT - 1) // NT):
        c = tid + i * NT
        if (BN * CPR) % NT == 0 or c < BN * CPR:
            rr = c // CPR
            cw = (c % CPR) * 4
            src = cache + i64(min(kt + rr, kv_hi - 1)) * i64(D // 2) + i64(cw)
            pk.cp_async(kv_smem, rr * RSW + cw, k32, src)
            pk.cp_async(kv_smem, (BN + rr) * RSW + cw, v32, src)


@pk.func
def finish_scores(sacc, kt: i32, t: i32, pos, lo, softcap: f32, masked: bool, BN: Const[int],
                  MT: Const[int]):
    """Soft-capping and the causal / window mask over the whole tile, each behind one uniform
    branch (per-score branches keep ptxas from interleaving the tile's mma). Row r (m-tile
    r // 2, half r % 2) sees keys lo[r] < key <= pos[r]."""
    if softcap > 0.0:
        inv = 1.0 / softcap
        for e in pk.static_range(MT * BN // 2):
            sacc[e] = softcap * pk.tanh(sacc[e] * inv) * LOG2E
    if masked:
        for mt in pk.static_range(MT):
            for nt in pk.static_range(BN // 8):
                for e in pk.static_range(4):
                    r = mt * 2 + e // 2
                    key = kt + nt * 8 + 2 * t + e % 2
                    # lo < key <= pos as one unsigned compare
                    visible = u32(key - lo[r] - 1) < u32(pos[r] - lo[r])
                    i = (mt * (BN // 8) + nt) * 4 + e
                    sacc[i] = sacc[i] if visible else MASKED


@pk.func
def load_q(q, qf, q0: i64, row0: i32, n_rows: i32, group: i32, q_row: i32, kvh: i32, t: i32,
           q_scale: f32, D: Const[int], MT: Const[int]):
    """qf[(mt * D/16 + kstep) * 4 + w]: the A fragments of m-tile mt (rows row0 + 16 mt + g,
    + 8), pre-scaled, as f16 pairs; rows past n_rows are zero. The first token's heads start
    at q + q0, each next token's q_row values after the previous one's."""
    for mt in pk.static_range(MT):
        for kstep in pk.static_range(D // 16):
            for half in pk.static_range(2):
                col = kstep * 16 + half * 8 + 2 * t
                for which in pk.static_range(2):
                    r = row0 + mt * 16 + which * 8
                    x0 = f32(0.0)
                    x1 = f32(0.0)
                    if r < n_rows:
                        base = q0 + i64((r // group) * q_row + (kvh * group + r % group) * D
                                        + col)
                        x0 = q[base] * q_scale
                        x1 = q[base + 1] * q_scale
                    qf[(mt * (D // 16) + kstep) * 4 + half * 2 + which] = pk.pack_f16x2(x0, x1)


@pk.func
def tile_scores(tile, qf, sacc, k_lane: i32, D: Const[int], BN: Const[int], MT: Const[int]):
    """sacc = Q K^T for the warp's MT m-tiles and the tile's BN keys: per 16 keys and 16 dims one
    ldmatrix (two n-tiles' B fragments) feeds 2 * MT mma."""
    RSW = D // 2 + 4
    for np2 in pk.static_range(BN // 16):
        acc = pk.local_array(f32, 8 * MT)
        for i in pk.static_range(8 * MT):
            acc[i] = 0.0
        for kstep in pk.static_range(D // 16):
            b0, b1, b2, b3 = pk.ldmatrix(tile, k_lane + np2 * 16 * RSW + kstep * 8)
            for mt in pk.static_range(MT):
                a = (mt * (D // 16) + kstep) * 4
                for h in pk.static_range(2):
                    c = (mt * 2 + h) * 4
                    acc[c], acc[c + 1], acc[c + 2], acc[c + 3] = pk.mma_m16n8k16_f16(
                        qf[a], qf[a + 1], qf[a + 2], qf[a + 3], b0 if h == 0 else b2,
                        b1 if h == 0 else b3, acc[c], acc[c + 1], acc[c + 2], acc[c + 3])
        for mt in pk.static_range(MT):
            for e in pk.static_range(8):
                sacc[(mt * (BN // 8) + np2 * 2) * 4 + e] = acc[mt * 8 + e]


@pk.func
def online_softmax(sacc, oacc, m, l, D: Const[int], BN: Const[int], MT: Const[int]):
    """Per row: new running max over the tile, scores -> exp2(s - max), the denominator and the
    output rows rescaled (skipped, warp-uniformly, when no row's max grew)."""
    grew = False
    for r in pk.static_range(2 * MT):
        mt = r // 2
        e0 = (r % 2) * 2
        mx = m[r]
        for nt in pk.static_range(BN // 8):
            i = (mt * (BN // 8) + nt) * 4 + e0
            mx = max(mx, max(sacc[i], sacc[i + 1]))
        for k in pk.static_range(2):                 # the 4 lanes of a quad share a row
            mx = max(mx, pk.shfl_xor(mx, 1 << k))
        corr = pk.fast.exp2(m[r] - mx)
        grew = grew or mx > m[r]
        m[r] = mx
        l[r] *= corr
        total = f32(0.0)
        for nt in pk.static_range(BN // 8):
            i = (mt * (BN // 8) + nt) * 4 + e0
            sacc[i] = pk.fast.exp2(sacc[i] - mx)
            sacc[i + 1] = pk.fast.exp2(sacc[i + 1] - mx)
            total += sacc[i] + sacc[i + 1]
        l[r] += total
        sacc[MT * BN // 2 + r] = corr                # the row's factor, kept for the rescale
    if pk.any_sync(grew):
        for r in pk.static_range(2 * MT):
            corr = sacc[MT * BN // 2 + r]
            for dt in pk.static_range(D // 8):
                i = ((r // 2) * (D // 8) + dt) * 4 + (r % 2) * 2
                oacc[i] *= corr
                oacc[i + 1] *= corr


@pk.func
def tile_pv(tile, sacc, oacc, v_lane: i32, D: Const[int], BN: Const[int], MT: Const[int]):
    """oacc += P V: P's A fragments straight from the exponentiated scores, V's B fragments
    from ldmatrix.trans on the row-major tile (one per 16 keys and 16 dims, 2 * MT mma)."""
    RSW = D // 2 + 4
    for kk in pk.static_range(BN // 16):
        pf = pk.local_array(u32, 4 * MT)
        for mt in pk.static_range(MT):
            base = (mt * (BN // 8) + kk * 2) * 4
            for w in pk.static_range(4):
                pf[mt * 4 + w] = pk.pack_f16x2(sacc[base + 2 * w], sacc[base + 2 * w + 1])
        for dp in pk.static_range(D // 16):
            b0, b1, b2, b3 = pk.ldmatrix(tile, v_lane + kk * 16 * RSW + dp * 8, trans=True)
            for mt in pk.static_range(MT):
                for h in pk.static_range(2):
                    i = (mt * (D // 8) + dp * 2 + h) * 4
                    oacc[i], oacc[i + 1], oacc[i + 2], oacc[i + 3] = pk.mma_m16n8k16_f16(
                        pf[mt * 4], pf[mt * 4 + 1], pf[mt * 4 + 2], pf[mt * 4 + 3],
                        b0 if h == 0 else b2, b1 if h == 0 else b3,
                        oacc[i], oacc[i + 1], oacc[i + 2], oacc[i + 3])


@pk.kernel
def prefill_flash(q: Ptr[f32, "ro"], k32: Ptr[u32, "ro"], v32: Ptr[u32, "ro"], out: Ptr[f32],
                  tokens: i32, q_row: i32, start0: i32, start_at: Ptr[i32, "ro"], max_len: i32,
                  n_head: i32, n_kv_head: i32,
                  q_scale: f32, softcap: f32, window: i32, seqs: Ptr[i32, "ro"],
                  D: Const[int], BN: Const[int], NWARPS: Const[int], STAGES: Const[int],
                  MT: Const[int], VARLEN: Const[bool], sinks: Ptr[f32, "ro"],
                  SINK: Const[bool]):
    NT = NWARPS * 32
    start = start0 + start_at[0]                   # device part: graphs replay at new starts
    q0 = i64(0)                                    # the sequence's first q / out values
    o0 = i64(0)
    cache = i64(0)
    if VARLEN:        # sequence z: its tokens' rows, count, first position and cache slot
        z = pk.block_idx.z
        q0 = i64(seqs[4 * z]) * i64(q_row)
        o0 = i64(seqs[4 * z]) * i64(n_head * D)
        tokens = seqs[4 * z + 1]
        start = seqs[4 * z + 2]
        cache = i64(seqs[4 * z + 3]) * i64(n_kv_head) * i64(max_len) * i64(D // 2)
    RSW = D // 2 + 4                               # row stride in u32 words (D + 8 halves)
    STAGE = 2 * BN * RSW                           # words of one stage (K tile + V tile)
    ROWS = 16 * MT * NWARPS                        # rows of a block
    smem = pk.dynamic_shared(u32)
    tid = pk.thread_idx.x
    lane = pk.lane_id()
    g = lane // 4
    t = lane % 4
    kvh = pk.block_idx.y
    group = n_head // n_kv_head
    n_rows = tokens * group
    block = pk.grid_dim.x - 1 - pk.block_idx.x     # heaviest (latest) rows first
    if VARLEN and block * ROWS >= n_rows:          # past a shorter sequence's rows
        return
    row0 = block * ROWS + (tid // 32) * 16 * MT + g
    pos = pk.local_array(i32, 2 * MT)              # row (mt, half)'s position and lowest
    lo = pk.local_array(i32, 2 * MT)               # invisible key (window), for the mask
    for r in pk.static_range(2 * MT):
        pos[r] = start + (row0 + 8 * r) // group
        lo[r] = -1
        if window > 0:
            lo[r] = pos[r] - window
    first_tok = (block * ROWS) // group
    last_tok = min(n_rows - 1, (block + 1) * ROWS - 1) // group
    kv_hi = start + last_tok + 1
    kv_lo = 0
    if window > 0:
        kv_lo = max(0, start + first_tok - window + 1)
    cache += i64(kvh) * i64(max_len) * i64(D // 2)
    n_tiles = (kv_hi - kv_lo + BN - 1) // BN

    for st in pk.static_range(STAGES - 1):          # the ring's first tiles
        if st < n_tiles:
            issue_tile(smem + st * STAGE, k32, v32, cache, kv_lo + st * BN, kv_hi, tid, D, BN,
                       NT)
        pk.cp_async_commit()

    qf = pk.local_array(u32, MT * D // 4)
    load_q(q, qf, q0, row0, n_rows, group, q_row, kvh, t, q_scale, D, MT)
    oacc = pk.local_array(f32, MT * D // 2)        # MT x (16 x D): D/8 n-tiles x 4 each
    for i in pk.static_range(MT * D // 2):
        oacc[i] = 0.0
    m = pk.local_array(f32, 2 * MT)
    l = pk.local_array(f32, 2 * MT)
    for r in pk.static_range(2 * MT):
        m[r] = NEG_INIT
        l[r] = 0.0
    sacc = pk.local_array(f32, MT * BN // 2 + 2 * MT)   # scores (+ each row's rescale factor)
    # this lane's ldmatrix row: K tiles (keys +0/+8 by lane bit 4, dims +8 by bit 3),
    # V tiles transposed (keys +8 by lane bit 3, dims +8 by bit 4)
    k_lane = ((lane // 16) * 8 + lane % 8) * RSW + ((lane // 8) % 2) * 4
    v_lane = BN * RSW + (((lane // 8) % 2) * 8 + lane % 8) * RSW + (lane // 16) * 4

    for j in range(n_tiles):
        kt = kv_lo + j * BN
        pk.cp_async_wait(STAGES - 2)               # this thread's copies of tile j landed
        pk.syncthreads()                           # everyone's; and tile j - 1 is consumed,
        if j + STAGES - 1 < n_tiles:               # so its stage takes tile j + STAGES - 1
            issue_tile(smem + ((j + STAGES - 1) % STAGES) * STAGE, k32, v32, cache,
                       kt + (STAGES - 1) * BN, kv_hi, tid, D, BN, NT)
        pk.cp_async_commit()                       # (an empty group keeps the count)
        tile = smem + (j % STAGES) * STAGE
        tile_scores(tile, qf, sacc, k_lane, D, BN, MT)
        finish_scores(sacc, kt, t, pos, lo, softcap,
                      kt + BN - 1 > start + first_tok or window > 0, BN, MT)
        online_softmax(sacc, oacc, m, l, D, BN, MT)
        tile_pv(tile, sacc, oacc, v_lane, D, BN, MT)

    for r in pk.static_range(2 * MT):
        total = l[r]
        for k in pk.static_range(2):
            total += pk.shfl_xor(total, 1 << k)
        if SINK:      # folded away without sinks: the dense kernel is unchanged
            total = with_sink(total, m[r], sinks, kvh * group + (row0 + 8 * r) % group, SINK)
        inv = 1.0 / total
        row = row0 + 8 * r
        if row < n_rows:
            base = o0 + i64(((row // group) * n_head + kvh * group + row % group) * D + 2 * t)
            for dt in pk.static_range(D // 8):
                i = ((r // 2) * (D // 8) + dt) * 4 + (r % 2) * 2
                out[base + dt * 8] = oacc[i] * inv
                out[base + dt * 8 + 1] = oacc[i + 1] * inv
