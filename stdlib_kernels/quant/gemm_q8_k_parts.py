"""Device parts of the super-block int8 GEMM (gemm_q8_k_kernels.py): staging copies, the per-stage
scale pass and the int8 A fragments read from raw weight blocks in shared memory.

Shared memory (u32 words), STAGES stage buffers then two scale buffers (parity of the stage):
    stage s: A = BM rows x AS words (the rows' raw super-block at this K step; Q4_0 / Q8_0 /
             Q4_1 / Q5_0 / Q5_1: their 8 raw 32-blocks, 144 / 272 / 160 / 176 / 192 B, 16-byte
             aligned when K % 256 == 0; AS pads a row to a stride of 4 mod 8 words),
             B = BN tokens x B_STRIDE words (their 8 raw Q8_1 blocks: 72 words, 4 pad)
    scales p (Q4_K / Q5_K / Q6_K only; not allocated for the others): SA = BM rows x 16
              words (Q4_K / Q5_K: d*sc per 32-block, then the 8 mins as 4 f16 pairs and
              dmin, for the min term's f16 mma; Q6_K: d*sc per 16), SB = BN tokens x 16
              f32 ((d, s) per Q8_1 block). The 32-value formats need no pass: their f16 d
              (Q4_1 / Q5_1: and m) and the tokens' f16 d / s are tensor-core operands as
              they lie in the stage.
Copies are `pk.cp_async` (done at once on the CPU target), waited on with pk.cp_async_wait.
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32, u64

from .decode8 import scale_min_k4
from .dot_q8 import LOW_NIBBLES
from .formats import Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0

B_STRIDE = 76          # 72 words of Q8_1 + 4: fragment rows g = 0..7 land in distinct bank quads
Q4K_WORDS = 36         # Q4_K super-block (144 B): d | dmin | scales:12 B | qs:128 B
Q6K_BYTES = 210        # Q6_K super-block: ql:128 B | qh:64 B | scales:i8[16] | d:f16
Q6K_SPAN = 53          # aligned words covering a 2-byte-aligned Q6_K super-block
Q40_WORDS = 36         # 8 Q4_0 blocks (8 x 18 B): d | qs:16 B, each d 2-byte aligned
Q80_WORDS = 68         # 8 Q8_0 blocks (8 x 34 B): d | qs:i8[32]
# 8 Q4_1 (8 x 20 B: d, m | qs:16 B), Q5_0 (8 x 22 B: d | qh:4 B | qs:16 B), Q5_1 (8 x 24 B:
# d, m | qh | qs) blocks: words copied per row and K step
STEP_WORDS = {Q4_K: Q4K_WORDS, Q4_0: Q40_WORDS, Q8_0: Q80_WORDS, Q4_1: 40, Q5_0: 44, Q5_1: 48,
              Q5_K: 44}    # Q5_K super-block (176 B): d | dmin | scales:12 B | qh:32 B | qs:128 B
SIGN_BITS = 0x80808080
SCALE_PASS_FMTS = (Q4_K, Q5_K, Q6_K)   # the rest read their f16 scales from the stage


def a_stride(fmt: int) -> int:
    """Words per weight row of one stage: the step's words, padded so that rows g = 0..7 of a
    fragment read land in distinct bank quads (a stride of 4 mod 8 words: 36, 44, 52, 68)."""
    if fmt == Q6_K:
        return Q6K_SPAN
    words = STEP_WORDS[fmt]
    return words if words % 8 == 4 else words + 4


def stage_words(fmt: int, bm: int, bn: int) -> int:
    return bm * a_stride(fmt) + bn * B_STRIDE


def shared_bytes(fmt: int, bm: int, bn: int, stages: int) -> int:
    """The stages, then (K-quants only) the scale pass's two buffers."""
    scales = 2 * 16 * (bm + bn) if fmt in SCALE_PASS_FMTS else 0
    return 4 * (stages * stage_words(fmt, bm, bn) + scales)


@pk.func
def copy16(sm, dst: i32, src, src_word: i32):
    """Words src[src_word .. +3] to shared sm[dst .. +3] (both 16-byte aligned), in flight."""
    pk.cp_async(sm, dst, src, src_word)


@pk.func
def copy_q6k_word(sm, dst: i32, w16, byte: u32, total: u32):
    """The aligned word at byte `byte` of the Q6_K buffer (total bytes, 2-byte multiple) to
    sm[dst]; a word running past the end gets only the bytes that exist (rest zero)."""
    pk.cp_async(sm, dst, w16, i32(byte // u32(2)), 4, src_size=min(total - byte, u32(4)))


@pk.func
def q6k_shift(row: i32, row_bytes: i32, sb: i32) -> i32:
    """Bytes (0 or 2) between a Q6_K super-block and the aligned word before it."""
    return i32((u32(row) * u32(row_bytes) + u32(sb) * u32(Q6K_BYTES)) & u32(3))


@pk.func
def fifth_bits(qh: u32, o: i32) -> u32:
    """Bits o..o+3 of a Q5 block's qh as bit 4 of bytes 0..3 (the quants' fifth bits)."""
    h = (qh >> u32(o)) & u32(15)
    return ((h & u32(1)) << u32(4)) | ((h & u32(2)) << u32(11)) | ((h & u32(4)) << u32(18)) | \
        ((h & u32(8)) << u32(25))


@pk.func
def issue_stage(FMT: Const[int], sm, base: i32, w, xq, rows: i32, row_words: i32, tokens: i32,
                xstride: i32, row0: i32, tok0: i32, sb: i32, tid: i32, BM: Const[int],
                BN: Const[int], NT: Const[int], AS: Const[int], AW: Const[int]):
    """Start copying K step sb (one super-block) of rows row0.. and tokens tok0.. into the stage
    at word `base` (AW words per row and step, rows AS words apart). Rows past the end repeat
    the last one, tokens past the end are zeros (neither is stored)."""
    if FMT != Q6_K:   # u32 words; a K step of a row is AW // 4 aligned 16-byte pieces
        for j in pk.static_range((BM * (AW // 4) + NT - 1) // NT):
            i = tid + NT * j
            if i < BM * (AW // 4):
                r = i // (AW // 4)
                c = i % (AW // 4)
                src = min(row0 + r, rows - 1) * row_words + AW * sb + 4 * c
                copy16(sm, base + r * AS + 4 * c, w, src)
    else:   # row_words counts u16: row bytes = 2 row_words
        total = u32(rows) * u32(2 * row_words)
        for j in pk.static_range((BM * Q6K_SPAN + NT - 1) // NT):
            i = tid + NT * j
            if i < BM * Q6K_SPAN:
                r = i // Q6K_SPAN
                c = i % Q6K_SPAN
                row = min(row0 + r, rows - 1)
                start = u32(row) * u32(2 * row_words) + u32(sb) * u32(Q6K_BYTES)
                byte = (start & u32(0xFFFFFFFC)) + u32(4 * c)
                copy_q6k_word(sm, base + r * AS + c, w, byte, total)
    bbase = base + BM * AS
    for j in pk.static_range((BN * 18 + NT - 1) // NT):
        i = tid + NT * j
        if i < BN * 18:
            t = i // 18
            c = i % 18
            # a token past the end reads nothing and lands as zeros: when the padded tokens'
            # copies all read the last token's words, their requests pile onto the same few
            # L2 lines (72 tokens on 64-token tiles ran slower than 128)
            src = min(tok0 + t, tokens - 1) * xstride + 72 * sb + 4 * c
            pk.cp_async(sm, bbase + t * B_STRIDE + 4 * c, xq, src, 16,
                        src_size=u32(16) if tok0 + t < tokens else u32(0))


@pk.func
def byte_at(sm: Ptr[u32], base: i32, b: i32) -> u32:
    return (sm[base + b // 4] >> u32(8 * (b % 4))) & u32(0xFF)


@pk.func
def word_at(sm: Ptr[u32], base: i32, b: i32) -> u32:
    """Four bytes at an even byte offset b of the words at base (funnel shift of two words)."""
    i = base + b // 4
    pair = u64(sm[i]) | (u64(sm[i + 1]) << u64(32))
    return u32((pair >> u64(8 * (b % 4))) & u64(0xFFFFFFFF))


@pk.func
def scale_pass(FMT: Const[int], sm: Ptr[u32], smf: Ptr[f32], base: i32, sbase: i32,
               row0: i32, rows: i32, row_bytes: i32, sb: i32, tid: i32, BM: Const[int],
               BN: Const[int], NT: Const[int], AS: Const[int]):
    """Block scales of a landed K-quant stage as floats: SA (BM x 16) and SB (BN x 16) at
    sbase (nothing for the 32-value formats)."""
    # Q4_K / Q5_K, per (row, block pair p): words 2p, 2p + 1: d * sc of the two blocks; 8 + p:
    # their mins as an f16 pair (exact: 6-bit integers); 12: dmin (min_term's operands)
    if FMT != Q4_K and FMT != Q5_K and FMT != Q6_K:   # the 32-value formats: compute_stage
        return      # and min_term read their f16 d, m (and the tokens') from the stage itself
    if FMT == Q4_K or FMT == Q5_K:
        for j in pk.static_range((BM * 4 + NT - 1) // NT):
            i = tid + NT * j
            if i < BM * 4:
                r = i // 4
                p = i % 4
                a = base + r * AS
                d, dmin = pk.unpack_f16x2(sm[a])
                sc0, m0 = scale_min_k4(sm[a + 1], sm[a + 2], sm[a + 3], 2 * p)
                sc1, m1 = scale_min_k4(sm[a + 1], sm[a + 2], sm[a + 3], 2 * p + 1)
                pk.store_vec(smf, sbase + 16 * r + 2 * p, (d * sc0, d * sc1))
                sm[sbase + 16 * r + 8 + p] = pk.pack_f16x2(m0, m1)
                if p == 0:
                    smf[sbase + 16 * r + 12] = dmin
    for j in pk.static_range((BM * 16 + NT - 1) // NT):
        i = tid + NT * j
        if FMT == Q4_K or FMT == Q5_K or i >= BM * 16:
            break
        r = i // 16
        e = i % 16
        a = base + r * AS
        # Q6_K, e = 16-value group: i8 scale at byte 192 + e, d at byte 208
        sh = q6k_shift(min(row0 + r, rows - 1), row_bytes, sb)
        dbits = (sm[a + (sh + 208) // 4] >> u32(8 * ((sh + 208) % 4))) & u32(0xFFFF)
        d, unused = pk.unpack_f16x2(dbits)
        sc = i32(byte_at(sm, a, sh + 192 + e) << u32(24)) >> 24
        smf[sbase + i] = d * f32(sc)
    bbase = base + BM * AS
    for j in pk.static_range((BN * 8 + NT - 1) // NT):
        i = tid + NT * j
        if i >= BN * 8:
            break
        t = i // 8
        kb = i % 8
        d, s = pk.unpack_f16x2(sm[bbase + t * B_STRIDE + 9 * kb])
        pk.store_vec(smf, sbase + 16 * BM + 2 * i, (d, s))


@pk.func
def word_at_const(sm: Ptr[u32], i: i32, SH: Const[int]) -> u32:
    """Four bytes SH (0 or 2, known at compile time) bytes past word i."""
    if SH == 0:
        return sm[i]
    else:
        return (sm[i] >> u32(16)) | (sm[i + 1] << u32(16))


@pk.func
def a_fragment(FMT: Const[int], sm: Ptr[u32], a: i32, sh: i32, kb: Const[int], tg: i32):
    """(a0-or-a1 word, a2-or-a3 word) of one fragment row: int8 quants 32 kb + 4 tg .. +3 and
    +16 of the row whose stage words start at a (Q6_K: super-block sh bytes in)."""
    if FMT == Q4_0:   # block kb at byte 18 kb; qs byte l: value l (low nibble), 16 + l (high)
        v = word_at_const(sm, a + (18 * kb + 2) // 4 + tg, (18 * kb + 2) % 4)
        lo = ((v & u32(LOW_NIBBLES)) | u32(SIGN_BITS)) - u32(0x08080808)
        hi = (((v >> u32(4)) & u32(LOW_NIBBLES)) | u32(SIGN_BITS)) - u32(0x08080808)
        return lo ^ u32(SIGN_BITS), hi ^ u32(SIGN_BITS)
    elif FMT == Q8_0:  # block kb at byte 34 kb: qs = int8 values 0..31
        return word_at_const(sm, a + (34 * kb + 2) // 4 + tg, (34 * kb + 2) % 4), \
            word_at_const(sm, a + (34 * kb + 18) // 4 + tg, (34 * kb + 18) % 4)
    elif FMT == Q4_1:  # block kb at word 5 kb: d, m | qs (as Q4_0's, values 0..15)
        v = sm[a + 5 * kb + 1 + tg]
        return v & u32(LOW_NIBBLES), (v >> u32(4)) & u32(LOW_NIBBLES)
    elif FMT == Q5_1:  # block kb at word 6 kb: d, m | qh | qs; values 0..31
        v = sm[a + 6 * kb + 2 + tg]
        qh = sm[a + 6 * kb + 1]
        return (v & u32(LOW_NIBBLES)) | fifth_bits(qh, 4 * tg), \
            ((v >> u32(4)) & u32(LOW_NIBBLES)) | fifth_bits(qh, 16 + 4 * tg)
    elif FMT == Q5_0:  # block kb at byte 22 kb: d | qh | qs; values minus 16 (sign-bit trick)
        v = word_at_const(sm, a + (22 * kb + 6) // 4 + tg, (22 * kb + 6) % 4)
        qh = word_at_const(sm, a + (22 * kb + 2) // 4, (22 * kb + 2) % 4)
        lo = (v & u32(LOW_NIBBLES)) | fifth_bits(qh, 4 * tg) | u32(SIGN_BITS)
        hi = ((v >> u32(4)) & u32(LOW_NIBBLES)) | fifth_bits(qh, 16 + 4 * tg) | u32(SIGN_BITS)
        return (lo - u32(0x10101010)) ^ u32(SIGN_BITS), (hi - u32(0x10101010)) ^ u32(SIGN_BITS)
    elif FMT == Q5_K:   # as Q4_K with qs at word 12, plus bit kb of qh byte l (words 4..11)
        lo = sm[a + 12 + 8 * (kb // 2) + tg]
        hi = sm[a + 16 + 8 * (kb // 2) + tg]
        return ((lo >> u32(4 * (kb % 2))) & u32(LOW_NIBBLES)) | \
            (((sm[a + 4 + tg] >> u32(kb)) & u32(0x01010101)) << u32(4)), \
            ((hi >> u32(4 * (kb % 2))) & u32(LOW_NIBBLES)) | \
            (((sm[a + 8 + tg] >> u32(kb)) & u32(0x01010101)) << u32(4))
    elif FMT == Q4_K:   # qs byte 32 c + l holds value 64 c + l (low nibble) and 64 c + 32 + l
        lo = sm[a + 4 + 8 * (kb // 2) + tg]
        hi = sm[a + 8 + 8 * (kb // 2) + tg]
        return (lo >> u32(4 * (kb % 2))) & u32(LOW_NIBBLES), \
            (hi >> u32(4 * (kb % 2))) & u32(LOW_NIBBLES)
    else:   # value o: ql byte 64 n + 32 (g % 2) + l nibble g // 2, qh byte 128 + 32 n + l bits 2 g
        n = kb // 4
        g = kb % 4
        out = pk.local_array(u32, 2)
        for h in pk.static_range(2):
            ql = word_at(sm, a, sh + 64 * n + 32 * (g % 2) + 16 * h + 4 * tg)
            qh = word_at(sm, a, sh + 128 + 32 * n + 16 * h + 4 * tg)
            v = ((ql >> u32(4 * (g // 2))) & u32(LOW_NIBBLES)) | \
                (((qh >> u32(2 * g)) & u32(0x03030303)) << u32(4))
            out[h] = ((v | u32(0x80808080)) - u32(0x20202020)) ^ u32(0x80808080)
        return out[0], out[1]
