"""Prefill attention on tensor cores, FlashAttention-2 style, with K/V tiles streamed into shared
memory by `cp.async` (a ring of stages) and mma fragments read by `pk.ldmatrix`.

Input: q (tokens, n_head, D) f32 (query i sits at position start + i); K/V cache viewed as u32
pairs of f16, (n_kv_head, max_len, D / 2), holding positions 0 .. start + tokens - 1.
Output: out (tokens, n_head, D) f32.

Work split: grid (row blocks, n_kv_head). A block's 16 * NWARPS rows are (token, head) pairs
of one KV head's query group (row r -> token r // group, head r % group), so the group shares
every K/V tile; each warp owns 16 rows, its Q as f16 A fragments in registers.
Per tile of BN keys (a ring of STAGES shared-memory stages: tiles j + 1 .. j + STAGES - 1 in
flight while tile j is computed, one barrier per tile): S = Q K^T by mma with K's B fragments from `ldmatrix` (K row-major = B column-major),
masking only where the tile crosses the causal diagonal or a window, the online softmax in the
log2 domain, and O += P V with P's A fragments taken from the score accumulators and V's B
fragments from `ldmatrix(trans=True)` on the row-major V tile (no transposing stores). Rows are
padded by 8 halves, so the 8 rows of every ldmatrix tile fall in distinct banks.
No tokens x tokens matrix is ever stored.
"""
import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64, u32

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
def tile_score(s: f32, key: i32, pos: i32, window: i32, softcap: f32, masked: bool) -> f32:
    if softcap > 0.0:
        s = softcap * pk.tanh(s / softcap) * LOG2E
    if masked:
        visible = key <= pos and (window <= 0 or key > pos - window)
        s = s if visible else MASKED
    return s


@pk.kernel
def prefill_flash(q: Ptr[f32, "ro"], k32: Ptr[u32, "ro"], v32: Ptr[u32, "ro"], out: Ptr[f32],
                  tokens: i32, start: i32, max_len: i32, n_head: i32, n_kv_head: i32,
                  q_scale: f32, softcap: f32, window: i32,
                  D: Const[int], BN: Const[int], NWARPS: Const[int], STAGES: Const[int]):
    NT = NWARPS * 32
    RSW = D // 2 + 4                               # row stride in u32 words (D + 8 halves)
    STAGE = 2 * BN * RSW                           # words of one stage (K tile + V tile)
    smem = pk.dynamic_shared(u32)
    tid = pk.thread_idx.x
    lane = pk.lane_id()
    g = lane // 4
    t = lane % 4
    kvh = pk.block_idx.y
    group = n_head // n_kv_head
    n_rows = tokens * group
    block = pk.grid_dim.x - 1 - pk.block_idx.x     # heaviest (latest) rows first
    row_a = block * (16 * NWARPS) + (tid // 32) * 16 + g
    row_b = row_a + 8
    pos_a = start + row_a // group
    pos_b = start + row_b // group
    first_tok = (block * 16 * NWARPS) // group
    last_tok = min(n_rows - 1, (block + 1) * 16 * NWARPS - 1) // group
    kv_hi = start + last_tok + 1
    kv_lo = 0
    if window > 0:
        kv_lo = max(0, start + first_tok - window + 1)
    cache = i64(kvh) * i64(max_len) * i64(D // 2)
    n_tiles = (kv_hi - kv_lo + BN - 1) // BN

    for st in pk.static_range(STAGES - 1):          # the ring's first tiles
        if st < n_tiles:
            issue_tile(smem + st * STAGE, k32, v32, cache, kv_lo + st * BN, kv_hi, tid, D, BN,
                       NT)
        pk.cp_async_commit()

    qf = pk.local_array(u32, D // 4)               # A fragments, 4 per 16-wide k step
    for kstep in pk.static_range(D // 16):
        for half in pk.static_range(2):
            col = kstep * 16 + half * 8 + 2 * t
            for which in pk.static_range(2):
                r = row_a + which * 8
                x0 = f32(0.0)
                x1 = f32(0.0)
                if r < n_rows:
                    base = ((r // group) * n_head + kvh * group + r % group) * D + col
                    x0 = q[base] * q_scale
                    x1 = q[base + 1] * q_scale
                qf[kstep * 4 + half * 2 + which] = pk.pack_f16x2(x0, x1)
    oacc = pk.local_array(f32, D // 2)             # 16 x D: D/8 n-tiles x 4
    for i in pk.static_range(D // 2):
        oacc[i] = 0.0
    m_a = f32(NEG_INIT)
    m_b = f32(NEG_INIT)
    l_a = f32(0.0)
    l_b = f32(0.0)
    sacc = pk.local_array(f32, BN // 2)            # 16 x BN scores: BN/8 n-tiles x 4
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
        masked = kt + BN - 1 > start + first_tok or window > 0
        for np2 in pk.static_range(BN // 16):
            acc = pk.local_array(f32, 8)
            for i in pk.static_range(8):
                acc[i] = 0.0
            for kstep in pk.static_range(D // 16):
                b0, b1, b2, b3 = pk.ldmatrix(tile, k_lane + np2 * 16 * RSW + kstep * 8)
                acc[0], acc[1], acc[2], acc[3] = pk.mma_m16n8k16_f16(
                    qf[kstep * 4], qf[kstep * 4 + 1], qf[kstep * 4 + 2], qf[kstep * 4 + 3],
                    b0, b1, acc[0], acc[1], acc[2], acc[3])
                acc[4], acc[5], acc[6], acc[7] = pk.mma_m16n8k16_f16(
                    qf[kstep * 4], qf[kstep * 4 + 1], qf[kstep * 4 + 2], qf[kstep * 4 + 3],
                    b2, b3, acc[4], acc[5], acc[6], acc[7])
            for h in pk.static_range(2):
                key = kt + np2 * 16 + h * 8 + 2 * t
                nt = np2 * 2 + h
                sacc[nt * 4] = tile_score(acc[h * 4], key, pos_a, window, softcap, masked)
                sacc[nt * 4 + 1] = tile_score(acc[h * 4 + 1], key + 1, pos_a, window, softcap,
                                              masked)
                sacc[nt * 4 + 2] = tile_score(acc[h * 4 + 2], key, pos_b, window, softcap,
                                              masked)
                sacc[nt * 4 + 3] = tile_score(acc[h * 4 + 3], key + 1, pos_b, window, softcap,
                                              masked)
        mx_a = m_a
        mx_b = m_b
        for nt in pk.static_range(BN // 8):
            mx_a = max(mx_a, max(sacc[nt * 4], sacc[nt * 4 + 1]))
            mx_b = max(mx_b, max(sacc[nt * 4 + 2], sacc[nt * 4 + 3]))
        for r in pk.static_range(2):                 # the 4 lanes of a quad share a row
            mx_a = max(mx_a, pk.shfl_xor(mx_a, 1 << r))
            mx_b = max(mx_b, pk.shfl_xor(mx_b, 1 << r))
        corr_a = pk.fast.exp2(m_a - mx_a)
        corr_b = pk.fast.exp2(m_b - mx_b)
        m_a = mx_a
        m_b = mx_b
        l_a *= corr_a
        l_b *= corr_b
        for nt in pk.static_range(BN // 8):
            for e in pk.static_range(2):
                sacc[nt * 4 + e] = pk.fast.exp2(sacc[nt * 4 + e] - mx_a)
                l_a += sacc[nt * 4 + e]
                sacc[nt * 4 + 2 + e] = pk.fast.exp2(sacc[nt * 4 + 2 + e] - mx_b)
                l_b += sacc[nt * 4 + 2 + e]
        for dt in pk.static_range(D // 8):
            oacc[dt * 4] *= corr_a
            oacc[dt * 4 + 1] *= corr_a
            oacc[dt * 4 + 2] *= corr_b
            oacc[dt * 4 + 3] *= corr_b
        for kk in pk.static_range(BN // 16):
            p0 = pk.pack_f16x2(sacc[kk * 8], sacc[kk * 8 + 1])
            p1 = pk.pack_f16x2(sacc[kk * 8 + 2], sacc[kk * 8 + 3])
            p2 = pk.pack_f16x2(sacc[kk * 8 + 4], sacc[kk * 8 + 5])
            p3 = pk.pack_f16x2(sacc[kk * 8 + 6], sacc[kk * 8 + 7])
            for dp in pk.static_range(D // 16):
                b0, b1, b2, b3 = pk.ldmatrix(tile, v_lane + kk * 16 * RSW + dp * 8, trans=True)
                for h in pk.static_range(2):
                    i = (dp * 2 + h) * 4
                    oacc[i], oacc[i + 1], oacc[i + 2], oacc[i + 3] = pk.mma_m16n8k16_f16(
                        p0, p1, p2, p3, b0 if h == 0 else b2, b1 if h == 0 else b3,
                        oacc[i], oacc[i + 1], oacc[i + 2], oacc[i + 3])

    for r in pk.static_range(2):
        l_a += pk.shfl_xor(l_a, 1 << r)
        l_b += pk.shfl_xor(l_b, 1 << r)
    for which in pk.static_range(2):
        r = row_a + which * 8
        inv = 1.0 / (l_a if which == 0 else l_b)
        if r < n_rows:
            base = ((r // group) * n_head + kvh * group + r % group) * D + 2 * t
            for dt in pk.static_range(D // 8):
                out[base + dt * 8] = oacc[dt * 4 + which * 2] * inv
                out[base + dt * 8 + 1] = oacc[dt * 4 + which * 2 + 1] * inv
