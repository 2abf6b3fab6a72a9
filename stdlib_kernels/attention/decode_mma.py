"""Decode attention on tensor cores (f16 cache, head_dim a multiple of 32): the split kernel of
flash-decoding with the GQA group's heads as the narrow side of mma.sync m16n8k16 tiles.

Input/output: as decode_kernels.decode_partial (same parameters and partial format, so the host
switches kernels without touching the combine): q (n_z, n_head, D) f32, f16 K/V caches viewed
as u32 pairs, kv_len(z) = lens[z * lens_stride] + len_add + z * len_step; writes out (direct)
or one split's part_o / part_ml, and with FUSED the last split block of a head group combines.

Why tensor cores: the SIMT kernel spends ~85 instructions per key converting f16, multiplying and
shuffling (instruction-bound at ~57% of copy bandwidth). Here a warp handles 16 keys with
NP * 2 mma for S^T = K Q^T (keys as the 16 rows, the block's GB <= 8 heads as the 8 columns)
and NP * 2 mma for O^T += V^T P^T (head_dim as rows, heads as columns): ~6 instructions per key.

Fragment plumbing (lane = 4 * g + t; NP = D / 32):
- K as the A operand: lane (g, t) loads 16 bytes of key rows g and g + 8 of the tile, halves
  32p + 8t .. + 7 for each p < NP. The head_dim order inside a k-step is free (it is summed),
  so k-step (p, h) uses words 2h, 2h + 1 of those loads; Q (B operand, loaded once) is packed
  to f16 in the same order: lane (g, t) holds head g's halves 32p + 8t .. + 7 (0 past GB).
- P as the B operand: the S^T accumulator holds (key g, heads 2t, 2t + 1); `pk.movmatrix`
  transposes each 8 x 8 quarter into (keys 2t, 2t + 1; head g), exactly a B fragment.
- V as the A operand of O^T: the same 16-byte loads as K; word w of a lane is an 8 x 8 matrix
  (keys x 8 head_dim columns), and movmatrix turns it into (head_dim row g, keys 2t, 2t + 1).
  Output row g of m-tile (p, wp), half r, is head_dim 32p + 8(g >> 1) + (g & 1) + 4 wp + 2 r.
Loads run a ring of P tiles ahead in registers (never behind a branch: keys past the split are
clamped and masked), like decode_partial. Scores are in the log2 domain (q pre-scaled).
"""
import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64, u32

from .decode_combine import MASKED, NEG_INIT
from .decode_kernels import LOG2E, block_work, combine_if_last, write_block_result


@pk.func
def load_tile(kp, vp, kb, vb, slot: i32, key0: i32, last_key: i32, g: i32, t: i32,
              D: Const[int], NP: Const[int]):
    """Raw K/V words of keys key0 + g and key0 + 8 + g into ring slot `slot`."""
    for j in pk.static_range(2):
        key = min(key0 + 8 * j + g, last_key)
        for p in pk.static_range(NP):
            at = i64(key) * i64(D // 2) + i64(16 * p + 4 * t)
            kw = pk.load_vec(kp, at, 4)
            vw = pk.load_vec(vp, at, 4)
            for w in pk.static_range(4):
                kb[((slot * 2 + j) * NP + p) * 4 + w] = kw[w]
                vb[((slot * 2 + j) * NP + p) * 4 + w] = vw[w]


@pk.func
def score_tile(kb, qb, slot: i32, key0: i32, k1: i32, g: i32, softcap: f32, s,
               NP: Const[int]):
    """s[0..3] = scores of (key0 + g, heads 2t, 2t+1) and (key0 + 8 + g, same heads)."""
    c0 = f32(0.0)
    c1 = f32(0.0)
    c2 = f32(0.0)
    c3 = f32(0.0)
    for p in pk.static_range(NP):
        for h in pk.static_range(2):
            lo = ((slot * 2) * NP + p) * 4
            hi = ((slot * 2 + 1) * NP + p) * 4
            c0, c1, c2, c3 = pk.mma_m16n8k16_f16(
                kb[lo + 2 * h], kb[hi + 2 * h], kb[lo + 2 * h + 1], kb[hi + 2 * h + 1],
                qb[p * 4 + 2 * h], qb[p * 4 + 2 * h + 1], c0, c1, c2, c3)
    s[0] = c0
    s[1] = c1
    s[2] = c2
    s[3] = c3
    for e in pk.static_range(4):
        x = s[e]
        if softcap > 0.0:
            x = softcap * pk.tanh(x / softcap) * LOG2E
        s[e] = x if key0 + g + 8 * (e // 2) < k1 else MASKED


@pk.func
def accumulate_tile(vb, s, m, den, oacc, slot: i32, NP: Const[int]):
    """Online softmax over the tile's 16 keys for this lane's two heads, then O^T += V^T P^T."""
    for e in pk.static_range(2):
        mx = max(s[e], s[e + 2])
        for r in pk.static_range(3):                 # over g: lanes 4, 8, 16 apart
            mx = max(mx, pk.shfl_xor(mx, 4 << r))
        if mx > m[e]:
            corr = pk.fast.exp2(m[e] - mx)
            m[e] = mx
            den[e] = den[e] * corr
            for i in pk.static_range(NP * 2):
                oacc[i * 4 + e] = oacc[i * 4 + e] * corr
                oacc[i * 4 + 2 + e] = oacc[i * 4 + 2 + e] * corr
        s[e] = pk.fast.exp2(s[e] - m[e])
        s[e + 2] = pk.fast.exp2(s[e + 2] - m[e])
        den[e] += s[e] + s[e + 2]
    b0 = pk.movmatrix(pk.pack_f16x2(s[0], s[1]))     # keys 2t, 2t+1 of rows 0..7; head g
    b1 = pk.movmatrix(pk.pack_f16x2(s[2], s[3]))     # keys 8 + 2t, 9 + 2t
    for p in pk.static_range(NP):
        for wp in pk.static_range(2):
            lo = ((slot * 2) * NP + p) * 4 + 2 * wp
            hi = ((slot * 2 + 1) * NP + p) * 4 + 2 * wp
            i = (p * 2 + wp) * 4
            d0, d1, d2, d3 = pk.mma_m16n8k16_f16(
                pk.movmatrix(vb[lo]), pk.movmatrix(vb[lo + 1]), pk.movmatrix(vb[hi]),
                pk.movmatrix(vb[hi + 1]), b0, b1, oacc[i], oacc[i + 1], oacc[i + 2],
                oacc[i + 3])
            oacc[i] = d0
            oacc[i + 1] = d1
            oacc[i + 2] = d2
            oacc[i + 3] = d3


@pk.func
def merge_warps(oacc, m, den, warp: i32, g: i32, t: i32, z: i32, h0: i32, split: i32,
                n_head: i32, direct: i32, out, part_o, part_ml,
                D: Const[int], GB: Const[int], NWARPS: Const[int], NP: Const[int]):
    """Each warp's (m, den, O) per head meet in shared memory; the block writes its GB heads
    normalised (direct) or as this split's partial."""
    sm_o = pk.shared_array(f32, NWARPS * GB * D)
    sm_m = pk.shared_array(f32, NWARPS * GB)
    sm_den = pk.shared_array(f32, NWARPS * GB)
    for e in pk.static_range(2):
        total = den[e]
        for r in pk.static_range(3):
            total += pk.shfl_xor(total, 4 << r)
        head = 2 * t + e
        if head < GB:
            if g == 0:
                sm_m[warp * GB + head] = m[e]
                sm_den[warp * GB + head] = total
            for p in pk.static_range(NP):
                for wp in pk.static_range(2):
                    for r in pk.static_range(2):
                        d = 32 * p + 8 * (g >> 1) + (g & 1) + 4 * wp + 2 * r
                        sm_o[(warp * GB + head) * D + d] = oacc[(p * 2 + wp) * 4 + 2 * r + e]
    pk.syncthreads()
    write_block_result(sm_o, sm_m, sm_den, z, h0, split, n_head, direct, out, part_o, part_ml,
                       D, GB, NWARPS)


@pk.kernel
def decode_mma(q: Ptr[f32, "ro"], k_cache: Ptr[u32, "ro"], v_cache: Ptr[u32, "ro"],
               lens: Ptr[i32, "ro"], lens_stride: i32, len_add: i32, len_step: i32,
               cache_z_stride: i64, max_len: i32, n_head: i32, n_kv_head: i32,
               q_scale: f32, softcap: f32, window: i32, direct: i32,
               out: Ptr[f32], part_o: Ptr[f32], part_ml: Ptr[f32], counters: Ptr[i32],
               D: Const[int], GB: Const[int], NWARPS: Const[int], P: Const[int],
               FUSED: Const[int], SG: Const[int], TPG: Const[int], MAXS: Const[int],
               UNR: Const[int]):
    NP = D // 32
    lane = pk.lane_id()
    warp = pk.thread_idx.x // 32
    g = lane // 4
    t = lane % 4
    z, split, kvh, h0, k0, k1 = block_work(lens, lens_stride, len_add, len_step, window,
                                           n_head, n_kv_head, GB)
    base_off = (i64(z) * cache_z_stride + i64(kvh) * i64(max_len) * i64(D)) // 2
    kp = k_cache + base_off
    vp = v_cache + base_off
    last_key = max(0, k1 - 1)

    qb = pk.local_array(u32, NP * 4)                 # B fragments of Q^T, f16 pairs
    for p in pk.static_range(NP):
        for w in pk.static_range(4):
            x0 = f32(0.0)
            x1 = f32(0.0)
            if g < GB:
                at = (z * n_head + h0 + g) * D + 32 * p + 8 * t + 2 * w
                x0 = q[at] * q_scale
                x1 = q[at + 1] * q_scale
            qb[p * 4 + w] = pk.pack_f16x2(x0, x1)
    oacc = pk.local_array(f32, NP * 8)
    for i in pk.static_range(NP * 8):
        oacc[i] = 0.0
    m = pk.local_array(f32, 2)
    den = pk.local_array(f32, 2)
    for e in pk.static_range(2):
        m[e] = NEG_INIT
        den[e] = 0.0
    s = pk.local_array(f32, 4)

    kb = pk.local_array(u32, P * 2 * NP * 4)         # the ring: P tiles of raw 16-byte chunks
    vb = pk.local_array(u32, P * 2 * NP * 4)
    stride = NWARPS * 16                             # keys of one ring step of the whole block
    first = k0 + warp * 16
    for p in pk.static_range(P - 1):
        load_tile(kp, vp, kb, vb, p, first + p * stride, last_key, g, t, D, NP)
    base = first
    while base < k1:
        for p in pk.static_range(P):
            load_tile(kp, vp, kb, vb, (p + P - 1) % P, base + (p + P - 1) * stride, last_key,
                      g, t, D, NP)
            key0 = base + p * stride
            if key0 < k1:
                score_tile(kb, qb, p, key0, k1, g, softcap, s, NP)
                accumulate_tile(vb, s, m, den, oacc, p, NP)
        base += P * stride
    merge_warps(oacc, m, den, warp, g, t, z, h0, split, n_head, direct, out, part_o, part_ml,
                D, GB, NWARPS, NP)
    if FUSED:
        combine_if_last(counters, part_o, part_ml, out, z, h0, n_head, direct, GB, D, NWARPS,
                        SG, TPG, MAXS, UNR)
