"""Q6_K parts of the tensor-core GEMV (gemv_mma.py): a thread's loads of one row's super-block
and the warp's mma over it. In: weight rows as u16 words (gemv.weight_words), Q8_1 activation
words; out: the f32 accumulators of gemv_mma's kernel.

Q6_K super-block (210 B = 105 u16): ql:128 B | qh:64 B | scales:i8[16] | d:f16. Values 128 h +
32 i + l (half h, i = 0..3, l = 0..31): low bits ql byte 64 h + 32 (i % 2) + l, nibble i // 2;
high bits qh byte 32 h + l, bits 2 i, 2 i + 1; scale byte 8 h + 2 i + l // 16. A scale covers 16
values, so each mma is an `mma.m16n8k16.s8` of one scale group (a k32 mma would mix two) in
the architectural K order: thread tg's A register holds values 4 tg .. 4 tg + 3 of the group,
B the same four activations (word 1 + 4 j + tg of the Q8_1 block of 32). Across the
super-block a thread's bytes of a row are then one 4-byte piece of each 16-byte window:
canonical word W (byte 16 W + 4 tg; W = 0..7 ql, 8..11 qh) serves 2 (ql) or 4 (qh) groups.
Values q - 32 are made int8 per byte (dot_q8_k.q6k_group), so no activation sums are needed
(Q8_1's s sums 32 values, not 16). Two groups of one 32-block fold in integers (i8 scales),
then one fma per accumulator: acc += d dx (sc0 p0 + sc1 p1).

Alignment: 210 % 4 == 2, so a super-block starts 0 or 2 bytes past a word (the parity of its
u16 index; rows of an odd count of super-blocks alternate). The quad of a fragment row loads
the block's aligned words 4 W + tg (W = 0..12: coalesced 16-byte pieces); a thread's word at
an odd start is the high half of its own word and the low half of its neighbour's (lane tg + 1;
lane 3 takes lane 0's next window), one shuffle and one `prmt` per word, whatever the row's
parity (no branch, so rows of both parities share a warp). Scales come the same way (4 aligned
words, plus word 52 at an odd start); d is one u16 load. Per row and super-block a thread
issues 15 loads (13 words, word 52, d) and 16 shuffles; a warp 16 mma per m16 x n8 tile.
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u16, u32

from .dot_q8_k import q6k_group

Q6K_U16 = 105          # one super-block in u16 words
Q6K_REGS = 17          # words a thread keeps per row and super-block: 12 quant | 4 scale | d


@pk.func
def word_at(w: Ptr[u16, "ro"], i: i32) -> u32:
    """The aligned 4 bytes at even u16 index i (one 32-bit load)."""
    lo, hi = pk.load_vec(w, i, 2)
    return u32(lo) | (u32(hi) << u32(16))


@pk.func
def load_q6k(w: Ptr[u16, "ro"], b: i32, lane: i32, q, o: Const[int]):
    """The super-block at u16 index b, this thread's part: canonical words W = 0..11 (bytes
    16 W + 4 tg .. +3) to q[o + W], the 16 scale bytes to q[o + 12..15], d's bits to q[o + 16].
    Warp-collective (shuffles): every lane calls it."""
    tg = lane % 4
    odd = b & 1
    a = b - odd                                   # the word at or before the block
    sel = u32(0x3210) + u32(0x2222) * u32(odd)    # bytes 0-3, or 2-5 of (own, neighbour)
    v = pk.local_array(u32, 13)
    for k in pk.static_range(13):                 # aligned words 4 k + tg (12: scales)
        v[k] = word_at(w, a + 8 * k + 2 * tg)
    src = lane - tg + (tg + 1) % 4
    for k in pk.static_range(12):
        give = v[k + 1] if tg == 0 else v[k]      # lane 0 hands lane 3 its next window
        q[o + k] = pk.prmt(v[k], pk.shfl_idx(give, src), sel)
    # word 52 at an odd start; at an even one word 51 (unused): word 52 may lie past the buffer
    last = word_at(w, a + 102 + 2 * odd)
    raw = pk.local_array(u32, 5)
    for k in pk.static_range(4):
        raw[k] = pk.shfl_idx(v[12], lane - tg + k)
    raw[4] = last
    for k in pk.static_range(4):
        q[o + 12 + k] = pk.prmt(raw[k], raw[k + 1], sel)
    q[o + 16] = u32(w[b + 104])


@pk.func
def scale_byte(word: u32, k: Const[int]) -> i32:
    """Signed byte k of word."""
    return i32(word << u32(24 - 8 * k)) >> 24


@pk.func
def block_sums_q6k(xq: Ptr[u32, "ro"], acc, q, o: Const[int], sb: i32, g: i32, tg: i32,
                   tokens: i32, xstride: i32, MI: Const[int], NT: Const[int]):
    """The 16 scale groups of one super-block of the warp's 16 MI rows (loaded at q[o..]:
    Q6K_REGS words per fragment row, rows g and g + 8 of m16 tile mi at o + 2 Q6K_REGS mi and
    + Q6K_REGS) against every token. 32-value block kb = 4 h + i holds groups 2 kb + j."""
    R = Q6K_REGS
    for kb in pk.static_range(8):
        h = kb // 4
        i = kb % 4
        blk = 9 * (8 * sb + kb)          # the tokens' Q8_1 block: (d, s) word, 8 quant words
        bx = pk.local_array(u32, 2 * NT)
        dx0 = pk.local_array(f32, NT)
        dx1 = pk.local_array(f32, NT)
        for nt in pk.static_range(NT):
            xb = min(8 * nt + g, tokens - 1) * xstride + blk          # B column: token g
            bx[2 * nt] = xq[xb + 1 + tg]
            bx[2 * nt + 1] = xq[xb + 5 + tg]
            d0, unused0 = pk.unpack_f16x2(xq[min(8 * nt + 2 * tg, tokens - 1) * xstride + blk])
            d1, unused1 = pk.unpack_f16x2(xq[min(8 * nt + 2 * tg + 1, tokens - 1) * xstride +
                                             blk])
            dx0[nt] = d0
            dx1[nt] = d1
        for mi in pk.static_range(MI):
            ra = o + 2 * R * mi
            rb = ra + R
            a = pk.local_array(u32, 4)              # groups j = 0, 1 of rows g, g + 8
            sc = pk.local_array(i32, 4)
            for j in pk.static_range(2):
                for r in pk.static_range(2):
                    row = ra + R * r
                    a[2 * j + r] = u32(q6k_group(q[row + 4 * h + 2 * (i % 2) + j],
                                                 q[row + 8 + 2 * h + j], u32(4 * (i // 2)),
                                                 u32(2 * i)))
                    sc[2 * j + r] = scale_byte(q[row + 12 + kb // 2], 2 * (kb % 2) + j)
            da, unused2 = pk.unpack_f16x2(q[ra + 16])
            db, unused3 = pk.unpack_f16x2(q[rb + 16])
            for nt in pk.static_range(NT):
                p0, p1, p2, p3 = pk.mma_m16n8k16_s8(a[0], a[1], bx[2 * nt], 0, 0, 0, 0)
                s0, s1, s2, s3 = pk.mma_m16n8k16_s8(a[2], a[3], bx[2 * nt + 1], 0, 0, 0, 0)
                i0 = 4 * (NT * mi + nt)  # C: (row g, tokens 2 tg, 2 tg + 1), row g + 8 alike
                acc[i0] = pk.fma(da * dx0[nt], f32(sc[0] * p0 + sc[2] * s0), acc[i0])
                acc[i0 + 1] = pk.fma(da * dx1[nt], f32(sc[0] * p1 + sc[2] * s1), acc[i0 + 1])
                acc[i0 + 2] = pk.fma(db * dx0[nt], f32(sc[1] * p2 + sc[3] * s2), acc[i0 + 2])
                acc[i0 + 3] = pk.fma(db * dx1[nt], f32(sc[1] * p3 + sc[3] * s3), acc[i0 + 3])
