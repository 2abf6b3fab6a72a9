"""Prefill attention on tensor cores: tiled flash attention (FlashAttention-2 style), causal,
over an f16 KV cache, with mma.sync m16n8k16 (f16 inputs, f32 accumulation) for QK^T and PV.

Input: q (tokens, n_head, D) f32 (query i sits at position start + i); K/V cache viewed as u32
pairs of f16, (n_kv_head, max_len, D / 2), holding positions 0 .. start + tokens - 1.
Output: out (tokens, n_head, D) f32.

Work split: grid (row blocks, n_kv_head). A block's 16 * NWARPS rows are (token, head) pairs
of one KV head's query group (row r -> token r // group, head r % group), so the group shares
every K/V tile. Per KV tile of BN keys: the block stages K (row-major) and V (transposed, so a
B fragment of P V is one 32-bit word) in shared memory, rows padded by 4 words so fragment reads
hit 32 distinct banks; each warp computes its 16 x BN
scores with mma, masks and soft-caps them, updates its online softmax (log2 domain), reuses the
score accumulators as the A fragments of P and accumulates P V into 16 x D in registers.
No tokens x tokens matrix is ever stored.
"""
import pykernel as pk
from pykernel import Const, Ptr, f16, f32, i32, i64, u16, u32

from .decode_kernels import LOG2E, MASKED, NEG_INIT


@pk.func
def masked_score(s: f32, key: i32, pos: i32, window: i32, softcap: f32) -> f32:
    if softcap > 0.0:
        s = softcap * pk.tanh(s / softcap) * LOG2E
    visible = key <= pos and (window <= 0 or key > pos - window)
    return s if visible else MASKED


@pk.kernel
def prefill_mma(q: Ptr[f32, "ro"], k32: Ptr[u32, "ro"], v32: Ptr[u32, "ro"], out: Ptr[f32],
                tokens: i32, start: i32, max_len: i32, n_head: i32, n_kv_head: i32,
                q_scale: f32, softcap: f32, window: i32,
                D: Const[int], BN: Const[int], NWARPS: Const[int]):
    RS = D // 2 + 4                         # K row stride in words (D + 8 halves)
    VS = BN // 2 + 4                        # V^T row stride in words (BN + 8 halves)
    smem = pk.dynamic_shared(u32)
    ks = smem                               # K tile, row-major (key, d)
    vt = smem + BN * (D // 2 + 4)           # V tile transposed (d, key): B fragments are words
    vt16 = pk.dynamic_shared(f16) + 2 * BN * (D // 2 + 4)
    tid = pk.thread_idx.x
    lane = pk.lane_id()
    g = lane // 4
    t = lane % 4
    kvh = pk.block_idx.y
    group = n_head // n_kv_head
    n_rows = tokens * group
    block = pk.grid_dim.x - 1 - pk.block_idx.x         # heaviest (latest) rows first
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

    qf = pk.local_array(u32, D // 4)                    # A fragments, 4 per 16-wide k step
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
    oacc = pk.local_array(f32, D // 2)                  # 16 x D: D/8 n-tiles x 4
    for i in pk.static_range(D // 2):
        oacc[i] = 0.0
    m_a = f32(NEG_INIT)
    m_b = f32(NEG_INIT)
    l_a = f32(0.0)
    l_b = f32(0.0)
    sacc = pk.local_array(f32, BN // 2)                 # 16 x BN scores: BN/8 n-tiles x 4

    # software pipeline: tile kt's K/V wait in registers (loaded during the previous tile's
    # compute), go to shared memory, then the next tile's loads are issued before computing
    # CHUNKS = BN * (D // 8) // (NWARPS * 32): 16-byte chunks per thread per tile (spelled out
    # where a compile-time value is needed)
    kreg = pk.local_array(u32, BN * (D // 8) // (NWARPS * 32) * 4)
    vreg = pk.local_array(u32, BN * (D // 8) // (NWARPS * 32) * 4)
    kt = kv_lo - BN
    while kt < kv_hi:
        if kt >= kv_lo:
            pk.syncthreads()                            # the previous tile is consumed
            for i in pk.static_range(BN * (D // 8) // (NWARPS * 32)):
                idx = tid + i * (NWARPS * 32)
                rr = idx // (D // 8)
                cw = (idx % (D // 8)) * 4
                for w in pk.static_range(4):
                    ks[rr * RS + cw + w] = kreg[i * 4 + w]
                rr = idx % BN
                cw = (idx // BN) * 4
                for w in pk.static_range(4):
                    d = 2 * (cw + w)
                    pair = vreg[i * 4 + w]
                    vt16[d * (BN + 8) + rr] = pk.bitcast(u16(pair & u32(0xFFFF)), f16)
                    vt16[(d + 1) * (BN + 8) + rr] = pk.bitcast(u16(pair >> u32(16)), f16)
            pk.syncthreads()
        nxt = kt + BN
        if nxt < kv_hi:
            for i in pk.static_range(BN * (D // 8) // (NWARPS * 32)):
                idx = tid + i * (NWARPS * 32)
                rr = idx // (D // 8)                    # K: a warp reads whole rows (coalesced)
                src = i64(min(nxt + rr, kv_hi - 1)) * i64(D // 2) + i64((idx % (D // 8)) * 4)
                kw = pk.load_vec(k32, cache + src, 4)
                rr = idx % BN                           # V: consecutive keys per warp, so the
                src = i64(min(nxt + rr, kv_hi - 1)) * i64(D // 2) + i64((idx // BN) * 4)
                vw = pk.load_vec(v32, cache + src, 4)   # transposed 16-bit stores don't collide
                for w in pk.static_range(4):
                    kreg[i * 4 + w] = kw[w]
                    vreg[i * 4 + w] = vw[w]
        if kt >= kv_lo:
            for nt in pk.static_range(BN // 8):
                c0 = f32(0.0)
                c1 = f32(0.0)
                c2 = f32(0.0)
                c3 = f32(0.0)
                for kstep in pk.static_range(D // 16):
                    word = (nt * 8 + g) * RS + kstep * 8 + t
                    c0, c1, c2, c3 = pk.mma_m16n8k16_f16(
                        qf[kstep * 4], qf[kstep * 4 + 1], qf[kstep * 4 + 2], qf[kstep * 4 + 3],
                        ks[word], ks[word + 4], c0, c1, c2, c3)
                key = kt + nt * 8 + 2 * t
                sacc[nt * 4] = masked_score(c0, key, pos_a, window, softcap)
                sacc[nt * 4 + 1] = masked_score(c1, key + 1, pos_a, window, softcap)
                sacc[nt * 4 + 2] = masked_score(c2, key, pos_b, window, softcap)
                sacc[nt * 4 + 3] = masked_score(c3, key + 1, pos_b, window, softcap)
            mx_a = m_a
            mx_b = m_b
            for nt in pk.static_range(BN // 8):
                mx_a = max(mx_a, max(sacc[nt * 4], sacc[nt * 4 + 1]))
                mx_b = max(mx_b, max(sacc[nt * 4 + 2], sacc[nt * 4 + 3]))
            for r in pk.static_range(2):                     # the 4 lanes of a quad share a row
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
                for dt in pk.static_range(D // 8):
                    word = (dt * 8 + g) * VS + kk * 8 + t
                    b0 = vt[word]
                    b1 = vt[word + 4]
                    d0, d1, d2, d3 = pk.mma_m16n8k16_f16(p0, p1, p2, p3, b0, b1, oacc[dt * 4],
                                                         oacc[dt * 4 + 1], oacc[dt * 4 + 2],
                                                         oacc[dt * 4 + 3])
                    oacc[dt * 4] = d0
                    oacc[dt * 4 + 1] = d1
                    oacc[dt * 4 + 2] = d2
                    oacc[dt * 4 + 3] = d3
        kt = nxt

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
