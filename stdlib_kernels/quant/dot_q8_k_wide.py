"""DP4A dot products of one wide item of a K-quant weight row (256-value super-blocks) with Q8_1
activations, for the wide GEMV kernels (gemv_kernels' *_WIDE formats) and the bulk kernel
(gemv_bulk.py): Q2_K / Q3_K / Q6_K items of 128 values (half a block), Q4_K items of 64 (a
chunk; q4k_half_dot / q5k_half_dot: 128), their activations brought into registers by 8- or
16-byte loads. dot_q8_<TYPE>_wide keeps dot_q8_k.py's contract (item `part` of block `blk`
times token bt's activations added to acc[a0 + bt]); the *_values / *_sum / *_half_dot parts
let the bulk kernel decode an item once for several tokens. The narrow items: dot_q8_k.py.
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f16, f32, i32, u16, u32

from .dot_q8 import LOW_NIBBLES, act, act_copy, act_scale, funnel16
from .dot_q8_k import ONES, byte_of, q4k_factors, q4k_scales, q6k_group, with_fifth, words_at


# Q2_K, 2 items per block: item n = half n (128 values, qs words 8n..8n+7, scale bytes
# 8n..8n+7), i.e. Q8_1 blocks 8 blk + 4n .. + 3 by 16-byte loads (16-byte aligned Q8_1 rows).
# Shift group j's 2-bit values are masked in place (bytes 4^j q, up to 192: unsigned dp4a
# operand) and the 4^j folded into the float scale: one operation per word instead of two.
@pk.func
def dot_q8_Q2_K_wide(w: Ptr[u32, "ro"], wrow: i32, blk: i32, n: i32, xq: Ptr[u32, "ro"],
                     xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    b = wrow + 21 * blk
    q = pk.local_array(u32, 8)
    for k in pk.static_range(8):
        q[k] = w[b + 4 + 8 * n + k]
    sc_lo = w[b + 2 * n]
    sc_hi = w[b + 2 * n + 1]
    d, dmin = pk.unpack_f16x2(w[b + 20])
    d_j = pk.local_array(f32, 4)
    for j in pk.static_range(4):
        d_j[j] = d * (0.25 ** j)
    a = pk.local_array(u32, 36)
    for bt in pk.static_range(BATCH):
        act_copy(xq, bt * xstride + 9 * (8 * blk + 4 * n), a, 36, 4)
        r = f32(0.0)
        for j in pk.static_range(4):
            part = f32(0.0)
            for h in pk.static_range(2):
                sv = 0
                sm = 0
                for k in pk.static_range(4):   # values in place: sv is 4^j times the dot
                    x = pk.bitcast(a[9 * j + 1 + 4 * h + k], i32)
                    sv = pk.dp4a(q[4 * h + k] & u32(0x03030303 << (2 * j)), x, sv)
                    sm = pk.dp4a(u32(ONES), x, sm)
                sc = byte_of(sc_lo if j < 2 else sc_hi, (2 * j + h) % 4)
                part += d_j[j] * f32(sc & u32(15)) * f32(sv) - \
                    dmin * f32(sc >> u32(4)) * f32(sm)
            dx, sx = pk.unpack_f16x2(a[9 * j])
            r += dx * part
        acc[a0 + bt] += r


# Q4_K, 4 items per block: item c = chunk c (64 values: the 32 qs bytes at 16 + 32c, low nibbles
# sub-block 2c, high 2c + 1), Q8_1 blocks 8 blk + 2c and + 1 by 8-byte loads (8-byte aligned
# Q8_1 rows); the same arithmetic as two dot_q8_Q4_K items.
@pk.func
def dot_q8_Q4_K_wide(w: Ptr[u32, "ro"], wrow: i32, blk: i32, c: i32, xq: Ptr[u32, "ro"],
                     xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    b = wrow + 36 * blk
    head, s0, s1, s2 = pk.load_vec(w, b, 4)
    q = pk.local_array(u32, 8)
    q4k_chunk_words(w, b, c, q)
    d_lo, d_hi, m_lo, m_hi = q4k_factors(head, s0, s1, s2, c)
    a = pk.local_array(u32, 18)
    for bt in pk.static_range(BATCH):
        act_copy(xq, bt * xstride + 9 * (8 * blk + 2 * c), a, 18, 2)
        s_lo, s_hi = q4k_nibble_dots(q, a, 0)
        dx0, sx0 = act_scale(a, 0)
        dx1, sx1 = act_scale(a, 9)
        acc[a0 + bt] += d_lo * dx0 * f32(s_lo) + d_hi * dx1 * f32(s_hi) - \
            (m_lo * sx0 + m_hi * sx1)


@pk.func
def q4k_chunk_words(w: Ptr[u32, "ro"], b: i32, c: i32, q):
    """q[0..7] = the 32 qs bytes of chunk c of the Q4_K block at word b (two 16-byte loads)."""
    for h in pk.static_range(2):
        q0, q1, q2, q3 = pk.load_vec(w, b + 4 + 8 * c + 4 * h, 4)
        q[4 * h] = q0
        q[4 * h + 1] = q1
        q[4 * h + 2] = q2
        q[4 * h + 3] = q3


@pk.func
def q4k_nibble_dots(q, a, at: Const[int]):
    """(low-nibble, high-nibble) dp4a sums of a chunk's qs words q against the 2 Q8_1 blocks
    at words at .. at + 17 of a (sub-blocks 2c and 2c + 1)."""
    s_lo = 0
    s_hi = 0
    for k in pk.static_range(8):
        s_lo = pk.dp4a(q[k] & u32(LOW_NIBBLES), act(a, at + 1 + k), s_lo)
        s_hi = pk.dp4a((q[k] >> u32(4)) & u32(LOW_NIBBLES), act(a, at + 10 + k), s_hi)
    return s_lo, s_hi


@pk.func
def q3k_values(qs: u32, hm: u32, j: Const[int]) -> u32:
    """Bytes 2^E_j (q + 4 h) of shift group j (E = 0, 2, 4, 4) from a qs word (q = bits 2j, 2j+1
    of each byte) and a hmask word already shifted by 4n (h = bit j; bits 4..7 are not used, so
    that shift may pull in the next byte's): no borrows, no shift of qs except for j = 3 (whose
    bits 6..7 would push h out of the byte)."""
    if j == 0:
        return (qs & u32(0x03030303)) | ((hm << u32(2)) & u32(0x04040404))
    if j == 1:
        return (qs & u32(0x0C0C0C0C)) | ((hm << u32(3)) & u32(0x10101010))
    if j == 2:
        return (qs & u32(0x30303030)) | ((hm << u32(4)) & u32(0x40404040))
    return ((qs >> u32(2)) & u32(0x30303030)) | ((hm << u32(3)) & u32(0x40404040))


@pk.func
def q3k_scales(s0: u32, s1: u32, s2: u32, n: i32, sc):
    """sc[2j + hh] = the signed 6-bit scale (minus 32) of sub-block 8n + 2j + hh."""
    nsh = u32(4) * u32(n)
    sca = ((s0 >> nsh) & u32(LOW_NIBBLES)) | (((s2 >> nsh) << u32(4)) & u32(0x30303030))
    scb = ((s1 >> nsh) & u32(LOW_NIBBLES)) | \
        (((s2 >> (nsh + u32(2))) << u32(4)) & u32(0x30303030))
    for b in pk.static_range(8):
        sc[b] = i32(byte_of(sca if b < 4 else scb, b % 4)) - 32


# Q3_K read as u32 words (rows of an even number of 110-byte blocks are 4-byte aligned; block
# blk starts 2 (blk % 2) bytes into word 55 blk / 2), 2 items per block: item n = half n (128
# values: qs bytes 32 + 32n.., all 32 hmask bytes, bit 4n + j), Q8_1 blocks 8 blk + 4n .. + 3 by
# 16-byte loads. A value is q + 4h - 4: the dp4a runs on 2^E (q + 4h) (q3k_values) starting
# from -4 * 2^E * sum(x) of the 16-value sub-block (activations only: shared by the group's
# rows), times the integer scale; 2^-E goes into the float factor.
@pk.func
def dot_q8_Q3_K_wide(w: Ptr[u32, "ro"], wrow: i32, blk: i32, n: i32, xq: Ptr[u32, "ro"],
                     xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    v = pk.local_array(u32, 32)
    sc = pk.local_array(i32, 8)
    d = q3k_wide_values(w, wrow, blk, n, v, sc)
    a = pk.local_array(u32, 36)
    for bt in pk.static_range(BATCH):
        act_copy(xq, bt * xstride + 9 * (8 * blk + 4 * n), a, 36, 4)
        acc[a0 + bt] += d * q3k_wide_sum(v, sc, a)


@pk.func
def q3k_wide_values(w: Ptr[u32, "ro"], wrow: i32, blk: i32, n: i32, v, sc) -> f32:
    """Item n of block blk of the row at word wrow (global or shared memory): v[8 j + k] =
    the dp4a bytes 2^E_j (q + 4h) of shift group j, sc = its 8 signed scales; returns d."""
    wb = wrow + (55 * blk) // 2
    shift = u32(16) * u32(blk % 2)
    q = pk.local_array(u32, 16)   # hmask words 0..7 shifted by 4n bits, qs words of half n
    words_at(w, wb, shift + u32(4) * u32(n), q, 0, 8)
    words_at(w, wb + 8 + 8 * n, shift, q, 8, 8)
    r0 = w[wb + 24]
    r1 = w[wb + 25]
    r2 = w[wb + 26]
    r3 = w[wb + 27]
    q3k_scales(funnel16(r0, r1, shift), funnel16(r1, r2, shift), funnel16(r2, r3, shift), n, sc)
    for k in pk.static_range(8):
        for j in pk.static_range(4):
            v[8 * j + k] = q3k_values(q[8 + k], q[k], j)
    return f32(pk.bitcast(u16((r3 >> shift) & u32(0xFFFF)), f16))


@pk.func
def q3k_wide_sum(v, sc, a) -> f32:
    """sum over the item's 128 values of (q + 4h - 4) x / d (q3k_wide_values' v and sc, the
    4 Q8_1 blocks' 36 words in a)."""
    r = f32(0.0)
    for j in pk.static_range(4):
        unit = 1 if j == 0 else (4 if j == 1 else 16)   # 2^E_j
        inv_unit = 1.0 if j == 0 else (0.25 if j == 1 else 0.0625)
        t = 0
        for hh in pk.static_range(2):
            sumx = 0
            for k in pk.static_range(4):
                sumx = pk.dp4a(act(a, 9 * j + 1 + 4 * hh + k), ONES, sumx)
            s = sumx * (-4 * unit)
            for k in pk.static_range(4):
                s = pk.dp4a(v[8 * j + 4 * hh + k], act(a, 9 * j + 1 + 4 * hh + k), s)
            t += s * sc[2 * j + hh]
        dx, sx = act_scale(a, 9 * j)
        r += dx * inv_unit * f32(t)
    return r


# Q6_K as 128-value items (the bulk kernel, gemv_bulk.py): item n = half n of block blk, in a
# row of an even number of blocks read as u32 words (block blk starts 2 (blk % 2) bytes into
# word 52 blk + blk / 2). Group g (32 values, Q8_1 block 4n + g of the half): ql words
# 16n + 8 (g % 2) + k nibble g // 2, qh words 32 + 8n + k bits 2g; 16-value halves hh with
# the scale byte 192 + 8n + 2g + hh.
@pk.func
def q6k_wide_values(w: Ptr[u32, "ro"], wrow: i32, blk: i32, n: i32, v, sc) -> f32:
    """Item n of block blk of the row at word wrow (global or shared memory): v[8 g + k] =
    the int8 words (q - 32) of group g, sc[2 g + hh] its signed 16-value scales; returns d."""
    wb = wrow + 52 * blk + blk // 2
    shift = u32(16) * u32(blk % 2)
    q = pk.local_array(u32, 26)   # ql words of half n (16) | its qh words (8) | scale bytes
    words_at(w, wb + 16 * n, shift, q, 0, 16)
    words_at(w, wb + 32 + 8 * n, shift, q, 16, 8)
    words_at(w, wb + 48 + 2 * n, shift, q, 24, 2)
    for g in pk.static_range(4):
        for k in pk.static_range(8):
            v[8 * g + k] = q6k_group(q[8 * (g % 2) + k], q[16 + k], u32(4 * (g // 2)),
                                     u32(2 * g))
    for e in pk.static_range(8):
        sc[e] = i32(q[24 + e // 4] << u32(24 - 8 * (e % 4))) >> 24
    return f32(pk.bitcast(u16((w[wb + 52] >> shift) & u32(0xFFFF)), f16))


@pk.func
def q6k_wide_sum(v, sc, a) -> f32:
    """sum over the item's 128 values of (q - 32) x / d (q6k_wide_values' v and sc, the
    4 Q8_1 blocks' 36 words in a)."""
    r = f32(0.0)
    for g in pk.static_range(4):
        t = 0
        for hh in pk.static_range(2):
            s = 0
            for k in pk.static_range(4):
                s = pk.dp4a(v[8 * g + 4 * hh + k], act(a, 9 * g + 1 + 4 * hh + k), s)
            t += s * sc[2 * g + hh]
        dx, sx = act_scale(a, 9 * g)
        r += dx * f32(t)
    return r


@pk.func
def q4k_half_dot(w: Ptr[u32, "ro"], wrow: i32, blk: i32, n: i32, a) -> f32:
    """Half n (128 values: chunks 2n, 2n + 1 of dot_q8_Q4_K_wide) of Q4_K block blk of the row
    at word wrow (global or shared memory, 16-byte aligned) times the 4 Q8_1 blocks' 36
    words in a. (d and dmin applied once per chunk: in the runner's 8B decode 0.9% faster than
    dot_q8_Q4_K_wide's per-sub-block factors, which pay off there only over several tokens.)"""
    b = wrow + 36 * blk
    head, s0, s1, s2 = pk.load_vec(w, b, 4)
    d, dmin = pk.unpack_f16x2(head)
    r = f32(0.0)
    for cc in pk.static_range(2):
        q = pk.local_array(u32, 8)
        q4k_chunk_words(w, b, 2 * n + cc, q)
        s_lo, s_hi = q4k_nibble_dots(q, a, 18 * cc)
        r += q45k_chunk_sum(d, dmin, s0, s1, s2, 2 * n + cc, s_lo, s_hi, a, 18 * cc)
    return r


@pk.func
def q45k_chunk_sum(d: f32, dmin: f32, s0: u32, s1: u32, s2: u32, c: i32, s_lo: i32, s_hi: i32,
                   a, at: i32) -> f32:
    """Chunk c of a Q4_K / Q5_K block from its two sub-blocks' dp4a sums s_lo / s_hi against
    the Q8_1 blocks at words at and at + 9 of a: d sc sum(q x) - dmin m sum(x), per sub-block."""
    scp, mp = q4k_scales(s0, s1, s2, c)
    dx0, sx0 = act_scale(a, at)
    dx1, sx1 = act_scale(a, at + 9)
    return d * (f32(scp & u32(0xFF)) * dx0 * f32(s_lo) + f32(scp >> u32(8)) * dx1 *
                f32(s_hi)) - dmin * (f32(mp & u32(0xFF)) * sx0 + f32(mp >> u32(8)) * sx1)


@pk.func
def q5k_half_dot(w: Ptr[u32, "ro"], wrow: i32, blk: i32, n: i32, a) -> f32:
    """Half n (128 values) of Q5_K block blk of the row at word wrow (global or shared memory,
    16-byte aligned) times the 4 Q8_1 blocks' 36 words in a: q4k_half_dot's arithmetic on
    values whose fifth bit comes from qh (bit j of qh byte l: value l of sub-block j; the qh
    word k holds bytes 4k..4k+3, as qs word k of a chunk holds values 4k..4k+3)."""
    b = wrow + 44 * blk
    head, s0, s1, s2 = pk.load_vec(w, b, 4)
    d, dmin = pk.unpack_f16x2(head)
    qh = pk.local_array(u32, 8)
    q4k_chunk_words(w, b, 0, qh)                 # qh: the 8 words where Q4_K's chunk 0 is
    r = f32(0.0)
    for cc in pk.static_range(2):
        c = 2 * n + cc
        q = pk.local_array(u32, 8)
        q4k_chunk_words(w, b + 8, c, q)          # qs start 8 words later than Q4_K's
        s_lo = 0
        s_hi = 0
        for k in pk.static_range(8):
            s_lo = pk.dp4a(with_fifth(q[k], qh[k], 2 * c), act(a, 18 * cc + 1 + k), s_lo)
            s_hi = pk.dp4a(with_fifth(q[k] >> u32(4), qh[k], 2 * c + 1),
                           act(a, 18 * cc + 10 + k), s_hi)
        r += q45k_chunk_sum(d, dmin, s0, s1, s2, c, s_lo, s_hi, a, 18 * cc)
    return r
