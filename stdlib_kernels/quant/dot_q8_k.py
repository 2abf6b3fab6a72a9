"""DP4A dot products of one item of a K-quant weight row (256-value super-blocks) with Q8_1
activations: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. Same contract as dot_q8.py:
`dot_q8_<TYPE>(w, wrow, blk, part, xq, xstride, acc, a0, BATCH)` adds item `part` of block
`blk` times token bt's activations to acc[a0 + bt]. Each item loads 16..24 bytes of quantized
values (plus the block's scales, shared by its items and served from L1). The wide items (64 /
128 values, 8- or 16-byte activation loads) and the bulk kernel's parts: dot_q8_k_wide.py.
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f16, f32, i32, u16, u32

from .dot_q8 import LOW_NIBBLES, act, act_scale, funnel16, half16, pair16

ONES = 0x01010101


@pk.func
def byte_of(word: u32, k: i32) -> u32:
    return (word >> u32(8 * k)) & u32(0xFF)


@pk.func
def sub_bytes(v: u32, k: u32) -> i32:
    """Bytewise v - k (as signed bytes) for bytes v, k in 0..127, without borrows between bytes."""
    return pk.bitcast(((v | u32(0x80808080)) - k) ^ u32(0x80808080), i32)


# Q2_K block (84 B = 21 u32): scales:16 B | qs:64 B | d:f16 | dmin:f16. 4 items: half n = part/2
# (128 values), h = part%2 picks qs bytes 16h..16h+15 of the half; shift group j (0..3) holds
# values 128n + 32j + l, sub-block scale byte 8n + 2j + h: x = d*(sc&15)*q - dmin*(sc>>4).
# The min term uses the quantized activations (a dp4a with ones): sub-blocks are 16 values.
@pk.func
def dot_q8_Q2_K(w: Ptr[u32, "ro"], wrow: i32, blk: i32, part: i32, xq: Ptr[u32, "ro"],
                xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    b = wrow + 21 * blk
    n = part // 2
    h = part % 2
    q = pk.local_array(u32, 4)
    for k in pk.static_range(4):
        q[k] = w[b + 4 + 8 * n + 4 * h + k]
    sc_lo = w[b + 2 * n]
    sc_hi = w[b + 2 * n + 1]
    d, dmin = pk.unpack_f16x2(w[b + 20])
    for bt in pk.static_range(BATCH):
        r = f32(0.0)
        for j in pk.static_range(4):
            x = bt * xstride + 9 * (8 * blk + 4 * n + j)
            sv = 0
            sm = 0
            for k in pk.static_range(4):
                a = act(xq, x + 1 + 4 * h + k)
                sv = pk.dp4a((q[k] >> u32(2 * j)) & u32(0x03030303), a, sv)
                sm = pk.dp4a(u32(ONES), a, sm)
            sc = byte_of(sc_lo if j < 2 else sc_hi, h + 2 * (j % 2))
            dx, sx = act_scale(xq, x)
            r += dx * (d * f32(sc & u32(15)) * f32(sv) - dmin * f32(sc >> u32(4)) * f32(sm))
        acc[a0 + bt] += r


@pk.func
def scaled_group_dots(v, scale, xq: Ptr[u32, "ro"], xstride: i32, xblock: i32, half: i32,
                      acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    """acc[a0 + bt] += sum_g scale[g] dx_g (v words 4g..4g+3 . int8 words 4 half.. of Q8_1
    block xblock + g of token bt): four 16-value groups of one item, each with its scale."""
    for bt in pk.static_range(BATCH):
        r = f32(0.0)
        for g in pk.static_range(4):
            x = bt * xstride + 9 * (xblock + g)
            s = 0
            for k in pk.static_range(4):
                s = pk.dp4a(v[4 * g + k], act(xq, x + 1 + 4 * half + k), s)
            dx, sx = act_scale(xq, x)
            r += scale[g] * dx * f32(s)
        acc[a0 + bt] += r


# Q3_K block (110 B = 55 u16): hmask:32 B | qs:64 B | scales:12 B | d:f16. 4 items as Q2_K:
# n = part/2, h = part%2 (bytes l = 16h..16h+15); value 128n + 32j + l is
# ((qs[32n + l] >> 2j) & 3) - (hmask[l] bit 4n + j set ? 0 : 4), scale s = 8n + 2j + h
# (6 bits: low 4 from scales[s % 8] >> 4n, high 2 from scales[8 + s % 4] >> 2(s / 4); minus 32).
@pk.func
def dot_q8_Q3_K(w: Ptr[u16, "ro"], wrow: i32, blk: i32, part: i32, xq: Ptr[u32, "ro"],
                xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    b = wrow + 55 * blk
    n = part // 2
    h = part % 2
    v = pk.local_array(i32, 16)   # the 16 values of shift group j as 4 words of signed bytes
    for k in pk.static_range(4):
        qs = pair16(w, b + 16 + 16 * n + 8 * h + 2 * k)
        hm = pair16(w, b + 8 * h + 2 * k)
        for j in pk.static_range(4):
            q = ((qs >> u32(2 * j)) & u32(0x03030303)) | \
                (((hm >> (u32(j) + u32(4) * u32(n))) & u32(ONES)) << u32(2))
            v[4 * j + k] = sub_bytes(q, u32(0x04040404))
    s0 = pair16(w, b + 48)
    s1 = pair16(w, b + 50)
    s2 = pair16(w, b + 52)
    d = half16(w, b + 54)
    scale = pk.local_array(f32, 4)
    for j in pk.static_range(4):
        lo = (byte_of(s0 if j < 2 else s1, 2 * (j % 2) + h) >> (u32(4) * u32(n))) & u32(15)
        top = byte_of(s2, (2 * j) % 4 + h) >> (u32(2) * (u32(2) * u32(n) + u32(j // 2)))
        scale[j] = d * f32(i32(lo | ((top & u32(3)) << u32(4))) - 32)
    scaled_group_dots(v, scale, xq, xstride, 8 * blk + 4 * n, h, acc, a0, BATCH)


@pk.func
def word_dot(v0: u32, v1: u32, v2: u32, v3: u32, xq: Ptr[u32, "ro"], lo: i32) -> i32:
    """sum over 16 unsigned byte values times the int8 activations at words lo..lo+3."""
    s = pk.dp4a(v0, act(xq, lo), 0)
    s = pk.dp4a(v1, act(xq, lo + 1), s)
    s = pk.dp4a(v2, act(xq, lo + 2), s)
    return pk.dp4a(v3, act(xq, lo + 3), s)


@pk.func
def q4k_scales(s0: u32, s1: u32, s2: u32, c: i32):
    """6-bit (scale, min) pairs of sub-blocks 2c and 2c+1 as two u32 holding 2 bytes each."""
    sh = u32(16) * u32(c % 2)
    lo_sc = (s0 >> sh) & u32(0x3F3F)
    lo_m = (s1 >> sh) & u32(0x3F3F)
    hi_sc = ((s2 >> sh) & u32(0x0F0F)) | (((s0 >> sh) >> u32(2)) & u32(0x3030))
    hi_m = (((s2 >> sh) >> u32(4)) & u32(0x0F0F)) | (((s1 >> sh) >> u32(2)) & u32(0x3030))
    if c < 2:
        return lo_sc, lo_m
    return hi_sc, hi_m


@pk.func
def q4k_factors(head: u32, s0: u32, s1: u32, s2: u32, c: i32):
    """(d sc, d sc', dmin m, dmin m') of sub-blocks 2c and 2c+1 of a Q4_K / Q5_K super-block
    whose head word holds (d, dmin) as f16 and s0..s2 its 12 scale bytes."""
    scp, mp = q4k_scales(s0, s1, s2, c)
    d, dmin = pk.unpack_f16x2(head)
    return (d * f32(scp & u32(0xFF)), d * f32(scp >> u32(8)), dmin * f32(mp & u32(0xFF)),
            dmin * f32(mp >> u32(8)))


@pk.func
def q45k_apply(v0: u32, v1: u32, v2: u32, v3: u32, u0: u32, u1: u32, u2: u32, u3: u32,
               head: u32, s0: u32, s1: u32, s2: u32, c: i32, h: i32, blk: i32,
               xq: Ptr[u32, "ro"], xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    """Q4_K/Q5_K item: low-sub-block values v (bytes), high-sub-block values u, against
    activation blocks 8 blk + 2c and + 1; the min term through s counted by the h == 0 item."""
    d_lo, d_hi, m_lo, m_hi = q4k_factors(head, s0, s1, s2, c)
    min_once = f32(1 - h)   # the min term uses the whole 32-block sum(x): counted by h == 0
    for bt in pk.static_range(BATCH):
        x0 = bt * xstride + 9 * (8 * blk + 2 * c)
        dx0, sx0 = act_scale(xq, x0)
        dx1, sx1 = act_scale(xq, x0 + 9)
        s_lo = word_dot(v0, v1, v2, v3, xq, x0 + 1 + 4 * h)
        s_hi = word_dot(u0, u1, u2, u3, xq, x0 + 10 + 4 * h)
        acc[a0 + bt] += d_lo * dx0 * f32(s_lo) + d_hi * dx1 * f32(s_hi) - \
            min_once * (m_lo * sx0 + m_hi * sx1)


# Q4_K block (144 B = 36 u32): d:f16 | dmin:f16 | scales:12 B | qs:128 B. 8 items: chunk c = part/2
# (64 values: low nibbles = sub-block 2c, high = 2c+1), h = part%2 picks 16 of the 32 bytes.
@pk.func
def dot_q8_Q4_K(w: Ptr[u32, "ro"], wrow: i32, blk: i32, part: i32, xq: Ptr[u32, "ro"],
                xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    b = wrow + 36 * blk
    c = part // 2
    h = part % 2
    head, s0, s1, s2 = pk.load_vec(w, b, 4)
    v0, v1, v2, v3 = pk.load_vec(w, b + 4 + 8 * c + 4 * h, 4)
    q45k_apply(v0 & u32(LOW_NIBBLES), v1 & u32(LOW_NIBBLES), v2 & u32(LOW_NIBBLES),
               v3 & u32(LOW_NIBBLES), (v0 >> u32(4)) & u32(LOW_NIBBLES),
               (v1 >> u32(4)) & u32(LOW_NIBBLES), (v2 >> u32(4)) & u32(LOW_NIBBLES),
               (v3 >> u32(4)) & u32(LOW_NIBBLES), head, s0, s1, s2, c, h, blk, xq, xstride, acc,
               a0, BATCH)


@pk.func
def with_fifth(v: u32, hb: u32, bit: i32) -> u32:
    return (v & u32(LOW_NIBBLES)) | (((hb >> u32(bit)) & u32(ONES)) << u32(4))


# Q5_K block (176 B = 44 u32): d | dmin | scales:12 B | qh:32 B | qs:128 B. Items as Q4_K; the
# 5th bit of value l of sub-block 2c (2c+1) is bit 2c (2c+1) of qh[l], l = 16h..16h+15 here.
@pk.func
def dot_q8_Q5_K(w: Ptr[u32, "ro"], wrow: i32, blk: i32, part: i32, xq: Ptr[u32, "ro"],
                xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    b = wrow + 44 * blk
    c = part // 2
    h = part % 2
    head, s0, s1, s2 = pk.load_vec(w, b, 4)
    h0, h1, h2, h3 = pk.load_vec(w, b + 4 + 4 * h, 4)
    v0, v1, v2, v3 = pk.load_vec(w, b + 12 + 8 * c + 4 * h, 4)
    q45k_apply(with_fifth(v0, h0, 2 * c), with_fifth(v1, h1, 2 * c), with_fifth(v2, h2, 2 * c),
               with_fifth(v3, h3, 2 * c), with_fifth(v0 >> u32(4), h0, 2 * c + 1),
               with_fifth(v1 >> u32(4), h1, 2 * c + 1), with_fifth(v2 >> u32(4), h2, 2 * c + 1),
               with_fifth(v3 >> u32(4), h3, 2 * c + 1), head, s0, s1, s2, c, h, blk, xq,
               xstride, acc, a0, BATCH)


@pk.func
def q6k_group(ql: u32, qh: u32, qlshift: u32, qhshift: u32) -> i32:
    v = ((ql >> qlshift) & u32(LOW_NIBBLES)) | (((qh >> qhshift) & u32(0x03030303)) << u32(4))
    return sub_bytes(v, u32(0x20202020))


@pk.func
def signed_byte(word: u32, k: i32) -> f32:
    return f32(i32(word << u32(24 - 8 * k)) >> 24)


# Q6_K block (210 B = 105 u16): ql:128 B | qh:64 B | scales:i8[16] | d:f16. 8 items: half
# n = part/4 (128 values), i = part%4 picks bytes l0 = 8i..8i+7 of the half's 32-byte columns;
# group g (0..3) holds x[128n + 32g + l0 + t], scale index 8n + 2g + i/2.
@pk.func
def dot_q8_Q6_K(w: Ptr[u16, "ro"], wrow: i32, blk: i32, part: i32, xq: Ptr[u32, "ro"],
                xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    b = wrow + 105 * blk
    n = part // 4
    i = part % 4
    qa = b + 32 * n + 4 * i
    a0w = pair16(w, qa)
    a1w = pair16(w, qa + 2)
    b0w = pair16(w, qa + 16)
    b1w = pair16(w, qa + 18)
    qh = b + 64 + 16 * n + 4 * i
    h0 = pair16(w, qh)
    h1 = pair16(w, qh + 2)
    d = half16(w, b + 104)
    v = pk.local_array(i32, 8)
    scale = pk.local_array(f32, 4)
    for g in pk.static_range(4):
        lo0 = a0w if g % 2 == 0 else b0w
        lo1 = a1w if g % 2 == 0 else b1w
        v[2 * g] = q6k_group(lo0, h0, u32(4 * (g // 2)), u32(2 * g))
        v[2 * g + 1] = q6k_group(lo1, h1, u32(4 * (g // 2)), u32(2 * g))
        scale[g] = d * signed_byte(u32(w[b + 96 + 4 * n + g]), i // 2)
    for bt in pk.static_range(BATCH):
        x = bt * xstride + 9 * (8 * blk + 4 * n) + 1 + 2 * i
        r = f32(0.0)
        for g in pk.static_range(4):
            s = pk.dp4a(v[2 * g], act(xq, x + 9 * g), 0)
            s = pk.dp4a(v[2 * g + 1], act(xq, x + 9 * g + 1), s)
            dx, sx = act_scale(xq, x + 9 * g - 1 - 2 * i)
            r = r + scale[g] * dx * f32(s)
        acc[a0 + bt] += r


@pk.func
def words_at(w: Ptr[u32, "ro"], at: i32, shift: u32, out, o0: Const[int], COUNT: Const[int]):
    """out[o0 + k] = the COUNT words starting shift / 8 bytes into word `at` (COUNT + 1 loads)."""
    raw = pk.local_array(u32, COUNT + 1)
    for k in pk.static_range(COUNT + 1):
        raw[k] = w[at + k]
    for k in pk.static_range(COUNT):
        out[o0 + k] = funnel16(raw[k], raw[k + 1], shift)


# Q6_K read as u32 words (rows of an even number of 210-byte blocks are 4-byte aligned; block
# blk starts 2 (blk % 2) bytes into word 52 blk + blk / 2). 4 items per block: half n = part/2,
# j = part%2 picks bytes l = 16j..16j+15 of the half's 32-byte columns: ql at 64n + 16j (groups
# 0, 2) and 64n + 32 + 16j (1, 3), qh at 128 + 32n + 16j, scale of group g at 192 + 8n + 2g + j.
@pk.func
def dot_q8_Q6_K_words(w: Ptr[u32, "ro"], wrow: i32, blk: i32, part: i32, xq: Ptr[u32, "ro"],
                      xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    n = part // 2
    j = part % 2
    wb = wrow + 52 * blk + blk // 2
    shift = u32(16) * u32(blk % 2)
    q = pk.local_array(u32, 14)   # ql for groups 0/2 | ql for 1/3 | qh | 8 scale bytes
    words_at(w, wb + 16 * n + 4 * j, shift, q, 0, 4)
    words_at(w, wb + 16 * n + 8 + 4 * j, shift, q, 4, 4)
    words_at(w, wb + 32 + 8 * n + 4 * j, shift, q, 8, 4)
    words_at(w, wb + 48 + 2 * n, shift, q, 12, 2)
    d = f32(pk.bitcast(u16((w[wb + 52] >> shift) & u32(0xFFFF)), f16))
    v = pk.local_array(i32, 16)
    scale = pk.local_array(f32, 4)
    for g in pk.static_range(4):
        for k in pk.static_range(4):
            v[4 * g + k] = q6k_group(q[4 * (g % 2) + k], q[8 + k], u32(4 * (g // 2)),
                                     u32(2 * g))
        scale[g] = d * signed_byte(q[12 + g // 2] >> (u32(8) * u32(j)), (2 * g) % 4)
    scaled_group_dots(v, scale, xq, xstride, 8 * blk + 4 * n, j, acc, a0, BATCH)
