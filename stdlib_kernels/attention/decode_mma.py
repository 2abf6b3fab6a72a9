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
EARLY_KV (decode_kernels' docstring): the ring's first tiles load before the PDL wait in blocks
that end two rows before the newest, and in a direct launch (one split) with those rows
clamped away, each lane reloading its rows from kv_len - 2 on after the wait (reload_newest).

Q8 (a Q8_0 cache: int8 quants (.., max_len, D) plus one f16 scale per 32 values (.., max_len,
D / 32), ggml's block_q8_0 split in two arrays so the quants load aligned): Q is quantized to
int8 per (head, 32-block) in the prologue, with a second int8 term for its rounding residual
(1/256 of the step), and QK^T is two `mma.m16n8k32.s8` per 32-block (a lane
loads 8 quant bytes per key row and block: the same head_dim positions as the f16 layout), its
int32 result scaled by the key's and the head's block scales; V's quants times their scale become
the same f16 words the f16 path loads, so P V is unchanged.
"""
import pykernel as pk
from pykernel import Const, Ptr, f16, f32, i32, i64, u16, u32

from .decode_combine import MASKED, NEG_INIT
from .decode_kernels import (LOG2E, begin_block, block_work, combine_if_last,
                             loads_before_wait, write_block_result)

RESIDUAL = 1.0 / 256.0       # Q8: weight of Q's second int8 term


@pk.func
def load_row(kp, vp, ksp, vsp, kb, vb, ksc, vsc, slot: i32, j: Const[int], key: i32, t: i32,
             D: Const[int], NP: Const[int], Q8: Const[int]):
    """Row j (0: tile row g, 1: g + 8) of ring slot `slot` from cache row `key`: f16 halves
    32p + 8t .. + 7 (4 words), or with Q8 the int8 quants of the same positions (2 words) and
    the f16 scale of their 32-block."""
    W = 2 if Q8 else 4                               # u32 words per lane per 32-block
    for p in pk.static_range(NP):
        at = ((slot * 2 + j) * NP + p) * 4
        src = i64(key) * i64(D * W // 8) + i64(4 * W * p + W * t)
        kw = pk.load_vec(kp, src, W)
        vw = pk.load_vec(vp, src, W)
        for w in pk.static_range(W):
            kb[at + w] = kw[w]
            vb[at + w] = vw[w]
        if Q8:
            ksc[(slot * 2 + j) * NP + p] = ksp[i64(key) * i64(D // 32) + i64(p)]
            vsc[(slot * 2 + j) * NP + p] = vsp[i64(key) * i64(D // 32) + i64(p)]


@pk.func
def load_tile(kp, vp, ksp, vsp, kb, vb, ksc, vsc, slot: i32, key0: i32, last_key: i32, g: i32,
              t: i32, D: Const[int], NP: Const[int], Q8: Const[int]):
    """Raw K/V words of keys key0 + g and key0 + 8 + g (clamped to last_key) into ring slot
    `slot`."""
    for j in pk.static_range(2):
        load_row(kp, vp, ksp, vsp, kb, vb, ksc, vsc, slot, j, min(key0 + 8 * j + g, last_key),
                 t, D, NP, Q8)


@pk.func
def reload_newest(kp, vp, ksp, vsp, kb, vb, ksc, vsc, slot: i32, key0: i32, last_key: i32,
                  newest: i32, g: i32, t: i32, D: Const[int], NP: Const[int], Q8: Const[int]):
    """After the wait (EARLY_KV): this lane's rows of ring slot `slot` that are `newest` or
    later, which the loads before the wait left out (the previous kernel writes them)."""
    for j in pk.static_range(2):
        key = min(key0 + 8 * j + g, last_key)
        if key >= newest:
            load_row(kp, vp, ksp, vsp, kb, vb, ksc, vsc, slot, j, key, t, D, NP, Q8)


@pk.func
def scale_of(raw: u16) -> f32:
    return f32(pk.bitcast(raw, f16))


@pk.func
def q8_pair(word: u32, half: Const[int], scale: f32) -> u32:
    """Bytes 2 half, 2 half + 1 of word (int8 quants) times scale, as an f16 pair."""
    lo = f32(i32(word << u32(24 - 16 * half)) >> 24)
    hi = f32(i32(word << u32(16 - 16 * half)) >> 24)
    return pk.pack_f16x2(lo * scale, hi * scale)


@pk.func
def v_word(vb, vsc, slot: i32, j: Const[int], p: Const[int], w: Const[int], NP: Const[int],
           Q8: Const[int]) -> u32:
    """Word w (halves 32p + 8t + 2w, + 1) of V row j of the tile as an f16 pair."""
    at = ((slot * 2 + j) * NP + p) * 4
    if Q8:
        return q8_pair(vb[at + w // 2], w % 2, scale_of(vsc[(slot * 2 + j) * NP + p]))
    else:
        return vb[at + w]


@pk.func
def score_tile(kb, ksc, qb, dq, slot: i32, key0: i32, k1: i32, g: i32, softcap: f32, s,
               NP: Const[int], Q8: Const[int]):
    """s[0..3] = scores of (key0 + g, heads 2t, 2t+1) and (key0 + 8 + g, same heads).
    Q8: two int8 mma per 32-block (K's quants x Q's quants and x Q's residual quants, the
    latter worth 1/256), scaled by both blocks' scales."""
    c0 = f32(0.0)
    c1 = f32(0.0)
    c2 = f32(0.0)
    c3 = f32(0.0)
    for p in pk.static_range(NP):
        lo = ((slot * 2) * NP + p) * 4
        hi = ((slot * 2 + 1) * NP + p) * 4
        if Q8:
            i0, i1, i2, i3 = pk.mma_m16n8k32_s8(kb[lo], kb[hi], kb[lo + 1], kb[hi + 1],
                                                 qb[4 * p], qb[4 * p + 1], 0, 0, 0, 0)
            r0, r1, r2, r3 = pk.mma_m16n8k32_s8(kb[lo], kb[hi], kb[lo + 1], kb[hi + 1],
                                                 qb[4 * p + 2], qb[4 * p + 3], 0, 0, 0, 0)
            d_lo = scale_of(ksc[(slot * 2) * NP + p])
            d_hi = scale_of(ksc[(slot * 2 + 1) * NP + p])
            c0 += pk.fma(f32(r0), RESIDUAL, f32(i0)) * d_lo * dq[2 * p]
            c1 += pk.fma(f32(r1), RESIDUAL, f32(i1)) * d_lo * dq[2 * p + 1]
            c2 += pk.fma(f32(r2), RESIDUAL, f32(i2)) * d_hi * dq[2 * p]
            c3 += pk.fma(f32(r3), RESIDUAL, f32(i3)) * d_hi * dq[2 * p + 1]
        else:
            for h in pk.static_range(2):
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
def online_softmax(s, m, den, oacc, NP: Const[int]) -> tuple:
    """The tile's scores s -> P = 2^(s - m) with the running max m of this lane's two heads
    (over the 8 lanes sharing a head), den and O^T rescaled when m moves; returns P as the two
    f16 B fragments of P^T."""
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
    return b0, b1


@pk.func
def accumulate_tile(vb, vsc, s, m, den, oacc, slot: i32, NP: Const[int], Q8: Const[int]):
    """Online softmax over the tile's 16 keys for this lane's two heads, then O^T += V^T P^T."""
    b0, b1 = online_softmax(s, m, den, oacc, NP)
    for p in pk.static_range(NP):
        for wp in pk.static_range(2):
            i = (p * 2 + wp) * 4
            d0, d1, d2, d3 = pk.mma_m16n8k16_f16(
                pk.movmatrix(v_word(vb, vsc, slot, 0, p, 2 * wp, NP, Q8)),
                pk.movmatrix(v_word(vb, vsc, slot, 0, p, 2 * wp + 1, NP, Q8)),
                pk.movmatrix(v_word(vb, vsc, slot, 1, p, 2 * wp, NP, Q8)),
                pk.movmatrix(v_word(vb, vsc, slot, 1, p, 2 * wp + 1, NP, Q8)),
                b0, b1, oacc[i], oacc[i + 1], oacc[i + 2], oacc[i + 3])
            oacc[i] = d0
            oacc[i + 1] = d1
            oacc[i + 2] = d2
            oacc[i + 3] = d3


@pk.func
def load_q(q, qb, dq, q_scale: f32, row: i32, live: bool, t: i32, NP: Const[int],
           Q8: Const[int]):
    """Q^T's B fragments for this lane (head g = row's head, 0 when not live): halves
    32p + 8t .. + 7 as f16 pairs, or with Q8 as int8 quants of a per-(head, 32-block) scale d
    (amax / 127 over the 4 lanes of the group) plus int8 quants of the rounding residual in
    units of d / 256 (so Q keeps ~16 bits, not 8), with the scales of heads 2t, 2t + 1 in dq."""
    x = pk.local_array(f32, 8)
    for p in pk.static_range(NP):
        amax = f32(0.0)
        for e in pk.static_range(8):
            x[e] = 0.0
            if live:
                x[e] = q[row + 32 * p + 8 * t + e] * q_scale
            amax = max(amax, max(x[e], -x[e]))
        if Q8:
            for r in pk.static_range(2):
                amax = max(amax, pk.shfl_xor(amax, 1 << r))
            d = amax / 127.0
            inv = 1.0 / d if d > 0.0 else f32(0.0)
            for h in pk.static_range(2):
                word = u32(0)
                rest = u32(0)
                for e in pk.static_range(4):
                    qi = pk.rint(x[4 * h + e] * inv)
                    ri = min(max(pk.rint((x[4 * h + e] * inv - qi) * 256.0), -127.0), 127.0)
                    word = word | ((u32(i32(qi)) & u32(255)) << u32(8 * e))
                    rest = rest | ((u32(i32(ri)) & u32(255)) << u32(8 * e))
                qb[4 * p + h] = word
                qb[4 * p + 2 + h] = rest
            for e in pk.static_range(2):
                dq[2 * p + e] = pk.shfl_idx(d, (2 * t + e) * 4)
        else:
            for w in pk.static_range(4):
                qb[p * 4 + w] = pk.pack_f16x2(x[2 * w], x[2 * w + 1])


@pk.func
def clear_state(oacc, m, den, NP: Const[int]):
    """An empty online softmax for this lane's two heads: O^T accumulators, running max and
    denominator."""
    for i in pk.static_range(NP * 8):
        oacc[i] = 0.0
    for e in pk.static_range(2):
        m[e] = NEG_INIT
        den[e] = 0.0


@pk.func
def merge_warps(oacc, m, den, warp: i32, g: i32, t: i32, z: i32, h0: i32, split: i32,
                n_head: i32, direct: i32, out, part_o, part_ml, xq, sinks,
                D: Const[int], GB: Const[int], NWARPS: Const[int], NP: Const[int],
                Q8OUT: Const[int], CLUSTER: Const[int], SINK: Const[int]):
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
                       xq, sinks, D, GB, NWARPS, Q8OUT, CLUSTER, SINK)


@pk.func
def mma_prologue(kp, vp, ksp, vsp, kb, vb, ksc, vsc, first: i32, stride: i32, last_key: i32,
                 g: i32, t: i32, D: Const[int], NP: Const[int], P: Const[int], Q8: Const[int]):
    """The ring's first P - 1 tiles."""
    for p in pk.static_range(P - 1):
        load_tile(kp, vp, ksp, vsp, kb, vb, ksc, vsc, p, first + p * stride, last_key, g, t,
                  D, NP, Q8)


@pk.kernel
def decode_mma(q: Ptr[f32], k_cache: Ptr[u32, "ro"], v_cache: Ptr[u32, "ro"],
               k_scale: Ptr[u16, "ro"], v_scale: Ptr[u16, "ro"], lens: Ptr[i32, "ro"],
               lens_stride: i32, len_add: i32, len_step: i32,
               cache_z_stride: i64, max_len: i32, n_head: i32, n_kv_head: i32,
               q_scale: f32, softcap: f32, window: i32, direct: i32,
               out: Ptr[f32], part_o: Ptr[f32], part_ml: Ptr[f32], counters: Ptr[i32],
               xq: Ptr[u32], D: Const[int], GB: Const[int], NWARPS: Const[int], P: Const[int],
               FUSED: Const[int], SG: Const[int], TPG: Const[int], MAXS: Const[int],
               UNR: Const[int], Q8: Const[int], TRIGGER: Const[int], EARLY_KV: Const[int],
               Q8OUT: Const[int], CLUSTER: Const[int], sinks: Ptr[f32, "ro"],
               SINK: Const[int]):
    NP = D // 32
    lane = pk.lane_id()
    warp = pk.thread_idx.x // 32
    g = lane // 4
    t = lane % 4
    begin_block(TRIGGER, EARLY_KV)
    z, split, kvh, h0, k0, k1, kv_len = block_work(lens, lens_stride, len_add, len_step, window,
                                                   n_head, n_kv_head, GB)
    first_elem = i64(z) * cache_z_stride + i64(kvh) * i64(max_len) * i64(D)
    kp = k_cache + first_elem // (4 if Q8 else 2)    # u32 words of int8 quants / f16 pairs
    vp = v_cache + first_elem // (4 if Q8 else 2)
    ksp = k_scale + first_elem // 32                 # Q8: one f16 scale per 32 elements
    vsp = v_scale + first_elem // 32
    last_key = max(0, k1 - 1)

    # the ring's first tiles load before Q (EARLY_KV: possibly before the wait, while Q may
    # still be being written by the previous kernel)
    kb = pk.local_array(u32, P * 2 * NP * 4)         # the ring: P tiles of raw 16-byte chunks
    vb = pk.local_array(u32, P * 2 * NP * 4)
    ksc = pk.local_array(u16, P * 2 * NP)            # Q8: the rows' block scales
    vsc = pk.local_array(u16, P * 2 * NP)
    stride = NWARPS * 16                             # keys of one ring step of the whole block
    first = k0 + warp * 16
    # EARLY_KV: rows before kv_len - 2 load before the wait (a 128-byte line holding part of
    # the newest row must not enter L1 early). A direct launch (one split: every tile in one
    # block) loads its other rows early and a lane whose row is later loads it after the wait;
    # with splits only the blocks that end before kv_len - 2 load early (the last split's
    # early loads measured -0.2% on the 8B at depth 4096)
    newest = kv_len - 2
    early = newest > 0 and (loads_before_wait(k1, kv_len, EARLY_KV) or
                            (EARLY_KV != 0 and direct != 0))
    if early:
        mma_prologue(kp, vp, ksp, vsp, kb, vb, ksc, vsc, first, stride, min(last_key, newest - 1),
                     g, t, D, NP, P, Q8)
    if EARLY_KV:
        pk.grid_dependency_wait()
    if not early:
        mma_prologue(kp, vp, ksp, vsp, kb, vb, ksc, vsc, first, stride, last_key, g, t, D, NP,
                     P, Q8)
    elif k1 > newest:                                # this block holds the newest rows
        for p in pk.static_range(P - 1):
            reload_newest(kp, vp, ksp, vsp, kb, vb, ksc, vsc, p, first + p * stride, last_key,
                          newest, g, t, D, NP, Q8)

    qb = pk.local_array(u32, NP * 4)                 # B fragments of Q^T: f16 pairs, or int8
    dq = pk.local_array(f32, NP * 2)                 # Q8: Q's block scales, heads 2t, 2t + 1
    load_q(q, qb, dq, q_scale, (z * n_head + h0 + g) * D, g < GB, t, NP, Q8)
    oacc = pk.local_array(f32, NP * 8)
    m = pk.local_array(f32, 2)
    den = pk.local_array(f32, 2)
    clear_state(oacc, m, den, NP)
    s = pk.local_array(f32, 4)
    base = first
    while base < k1:
        for p in pk.static_range(P):
            load_tile(kp, vp, ksp, vsp, kb, vb, ksc, vsc, (p + P - 1) % P,
                      base + (p + P - 1) * stride, last_key, g, t, D, NP, Q8)
            key0 = base + p * stride
            if key0 < k1:
                score_tile(kb, ksc, qb, dq, p, key0, k1, g, softcap, s, NP, Q8)
                accumulate_tile(vb, vsc, s, m, den, oacc, p, NP, Q8)
        base += P * stride
    merge_warps(oacc, m, den, warp, g, t, z, h0, split, n_head, direct, out, part_o, part_ml,
                xq, sinks, D, GB, NWARPS, NP, Q8OUT, CLUSTER, SINK)
    if FUSED:
        combine_if_last(counters, part_o, part_ml, out, z, h0, n_head, direct, sinks, GB, D,
                        NWARPS, SG, TPG, MAXS, UNR, SINK)
