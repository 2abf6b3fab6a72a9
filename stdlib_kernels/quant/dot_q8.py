"""DP4A dot products of one "item" of a GGUF weight row with Q8_1 activations (device functions).

Each `dot_q8_<TYPE>(w, wrow, blk, part, xq, xrow) -> f32` returns the contribution of item `part`
of weight block `blk` of a row that starts at word `wrow` of `w`, against the Q8_1 activation row
that starts at word `xrow` of `xq` (u32 words; Q8_1 block = 9 words: d|s<<16, then 32 int8).
Items are sized so that one thread loads 16..32 bytes of quantized weights per item; ITEMS gives
the items per block. Weights come as u32 words where every block is 4-byte aligned (Q4_1, Q5_1,
Q2_K, Q4_K, Q5_K) and as u16 words otherwise. The Q8_1 `s` is sum(x) (llama.cpp's CUDA
convention), so offsets such as Q4_0's -8 cost one multiply per block instead of a dp4a.
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Ptr, f16, f32, i32, u16, u32

LOW_NIBBLES = 0x0F0F0F0F


@pk.func
def pair16(w: Ptr[u16, "ro"], i: i32) -> u32:
    """Four bytes at an even byte offset: two u16 loads (GGUF blocks are only 2-byte aligned)."""
    return u32(w[i]) | (u32(w[i + 1]) << u32(16))


@pk.func
def half16(w: Ptr[u16, "ro"], i: i32) -> f32:
    return f32(pk.bitcast(w[i], f16))


@pk.func
def act_scale(xq: Ptr[u32, "ro"], xblock: i32):
    """(d, s) of the Q8_1 block at word xblock."""
    return pk.unpack_f16x2(xq[xblock])


@pk.func
def act(xq: Ptr[u32, "ro"], i: i32) -> i32:
    return pk.bitcast(xq[i], i32)


@pk.func
def nibble_dot(v0: u32, v1: u32, v2: u32, v3: u32, xq: Ptr[u32, "ro"], lo: i32, hi: i32,
               shift: u32) -> i32:
    """sum over 16 values of ((v >> shift) & 15) * xq-bytes at words lo..lo+3 (no hi use if <0)."""
    s = pk.dp4a((v0 >> shift) & LOW_NIBBLES, act(xq, lo), 0)
    s = pk.dp4a((v1 >> shift) & LOW_NIBBLES, act(xq, lo + 1), s)
    s = pk.dp4a((v2 >> shift) & LOW_NIBBLES, act(xq, lo + 2), s)
    return pk.dp4a((v3 >> shift) & LOW_NIBBLES, act(xq, lo + 3), s)


@pk.func
def sub32_bytes(v: u32) -> u32:
    """Bytewise v - 32 for bytes in 0..63, without borrows between bytes."""
    return ((v | u32(0x80808080)) - u32(0x20202020)) ^ u32(0x80808080)


# Q4_0 block (18 B = 9 u16): d:f16 | qs:16 B; x[j] = (qs[j] & 15) - 8, x[j+16] = (qs[j] >> 4) - 8
@pk.func
def dot_q8_Q4_0(w: Ptr[u16, "ro"], wrow: i32, blk: i32, part: i32, xq: Ptr[u32, "ro"],
                xrow: i32) -> f32:
    b = wrow + 9 * blk
    v0 = pair16(w, b + 1)
    v1 = pair16(w, b + 3)
    v2 = pair16(w, b + 5)
    v3 = pair16(w, b + 7)
    x = xrow + 9 * blk
    dx, sx = act_scale(xq, x)
    s = nibble_dot(v0, v1, v2, v3, xq, x + 1, 0, u32(0)) + \
        nibble_dot(v0, v1, v2, v3, xq, x + 5, 0, u32(4))
    return half16(w, b) * (dx * f32(s) - 8.0 * sx)


# Q4_1 block (20 B = 5 u32): d:f16 | m:f16 | qs:16 B; x = q*d + m
@pk.func
def dot_q8_Q4_1(w: Ptr[u32, "ro"], wrow: i32, blk: i32, part: i32, xq: Ptr[u32, "ro"],
                xrow: i32) -> f32:
    b = wrow + 5 * blk
    d, m = pk.unpack_f16x2(w[b])
    v0 = w[b + 1]
    v1 = w[b + 2]
    v2 = w[b + 3]
    v3 = w[b + 4]
    x = xrow + 9 * blk
    dx, sx = act_scale(xq, x)
    s = nibble_dot(v0, v1, v2, v3, xq, x + 1, 0, u32(0)) + \
        nibble_dot(v0, v1, v2, v3, xq, x + 5, 0, u32(4))
    return d * dx * f32(s) + m * sx


# Q8_0 block (34 B = 17 u16): d:f16 | qs:i8[32]; x = q*d
@pk.func
def dot_q8_Q8_0(w: Ptr[u16, "ro"], wrow: i32, blk: i32, part: i32, xq: Ptr[u32, "ro"],
                xrow: i32) -> f32:
    b = wrow + 17 * blk
    x = xrow + 9 * blk
    s = i32(0)
    for k in pk.static_range(8):
        s = pk.dp4a(pk.bitcast(pair16(w, b + 1 + 2 * k), i32), act(xq, x + 1 + k), s)
    dx, sx = act_scale(xq, x)
    return half16(w, b) * dx * f32(s)


@pk.func
def q4k_scales(s0: u32, s1: u32, s2: u32, c: i32):
    """6-bit (scale, min) pairs of sub-blocks 2c and 2c+1 as two u32 holding 2 bytes each."""
    sh = u32(16 * (c % 2))
    lo_sc = (s0 >> sh) & u32(0x3F3F)
    lo_m = (s1 >> sh) & u32(0x3F3F)
    hi_sc = ((s2 >> sh) & u32(0x0F0F)) | (((s0 >> sh) >> u32(2)) & u32(0x3030))
    hi_m = (((s2 >> sh) >> u32(4)) & u32(0x0F0F)) | (((s1 >> sh) >> u32(2)) & u32(0x3030))
    if c < 2:
        return lo_sc, lo_m
    return hi_sc, hi_m


# Q4_K block (144 B = 36 u32): d:f16 | dmin:f16 | scales:12 B | qs:128 B. 8 items: chunk c = part/2
# (64 values: low nibbles = sub-block 2c, high = 2c+1), h = part%2 picks 16 of the 32 bytes.
@pk.func
def dot_q8_Q4_K(w: Ptr[u32, "ro"], wrow: i32, blk: i32, part: i32, xq: Ptr[u32, "ro"],
                xrow: i32) -> f32:
    b = wrow + 36 * blk
    c = part // 2
    h = part % 2
    dm, s0, s1, s2 = pk.load_vec(w, b, 4)
    v0, v1, v2, v3 = pk.load_vec(w, b + 4 + 8 * c + 4 * h, 4)
    scp, mp = q4k_scales(s0, s1, s2, c)
    d, dmin = pk.unpack_f16x2(dm)
    x0 = xrow + 9 * (8 * blk + 2 * c)
    dx0, sx0 = act_scale(xq, x0)
    dx1, sx1 = act_scale(xq, x0 + 9)
    s_lo = nibble_dot(v0, v1, v2, v3, xq, x0 + 1 + 4 * h, 0, u32(0))
    s_hi = nibble_dot(v0, v1, v2, v3, xq, x0 + 10 + 4 * h, 0, u32(4))
    r = d * (f32(scp & u32(0xFF)) * dx0 * f32(s_lo) + f32(scp >> u32(8)) * dx1 * f32(s_hi))
    if h == 0:  # the min term uses the whole 32-block sum(x): counted once per sub-block
        r = r - dmin * (f32(mp & u32(0xFF)) * sx0 + f32(mp >> u32(8)) * sx1)
    return r


@pk.func
def q6k_group(ql: u32, qh: u32, qlshift: u32, qhshift: u32) -> i32:
    v = ((ql >> qlshift) & LOW_NIBBLES) | (((qh >> qhshift) & u32(0x03030303)) << u32(4))
    return pk.bitcast(sub32_bytes(v), i32)


@pk.func
def signed_byte(word: u32, k: i32) -> f32:
    return f32(i32(word << u32(24 - 8 * k)) >> 24)


# Q6_K block (210 B = 105 u16): ql:128 B | qh:64 B | scales:i8[16] | d:f16. 8 items: half
# n = part/4 (128 values), i = part%4 picks bytes l0 = 8i..8i+7 of the half's 32-byte columns;
# group g (0..3) holds x[128n + 32g + l0 + t], scale index 8n + 2g + i/2.
@pk.func
def dot_q8_Q6_K(w: Ptr[u16, "ro"], wrow: i32, blk: i32, part: i32, xq: Ptr[u32, "ro"],
                xrow: i32) -> f32:
    b = wrow + 105 * blk
    n = part // 4
    i = part % 4
    qa = b + 32 * n + 4 * i
    a0 = pair16(w, qa)
    a1 = pair16(w, qa + 2)
    b0 = pair16(w, qa + 16)
    b1 = pair16(w, qa + 18)
    qh = b + 64 + 16 * n + 4 * i
    h0 = pair16(w, qh)
    h1 = pair16(w, qh + 2)
    x = xrow + 9 * (8 * blk + 4 * n) + 1 + 2 * i
    r = f32(0.0)
    for g in pk.static_range(4):
        sc = signed_byte(u32(w[b + 96 + 4 * n + g]), i // 2)
        lo0 = a0 if g % 2 == 0 else b0
        lo1 = a1 if g % 2 == 0 else b1
        s = pk.dp4a(q6k_group(lo0, h0, u32(4 * (g // 2)), u32(2 * g)), act(xq, x + 9 * g), 0)
        s = pk.dp4a(q6k_group(lo1, h1, u32(4 * (g // 2)), u32(2 * g)), act(xq, x + 9 * g + 1), s)
        dx, sx = act_scale(xq, x + 9 * g - 1 - 2 * i)
        r = r + sc * dx * f32(s)
    return half16(w, b + 104) * r


@pk.func
def shifted16(a: u32, b: u32) -> u32:
    """The 4 bytes starting 2 bytes into a (a's high half, then b's low half): a funnel shift."""
    return (a >> u32(16)) | (b << u32(16))


# Q4_0 block pair (36 B = 9 u32; rows of an even number of blocks are 4-byte aligned):
# word 0 = d0 | qs0[0:2], words 1-3 = qs0[2:14], word 4 = qs0[14:16] | d1, words 5-8 = qs1.
# One item = two blocks, loaded as 9 u32 instead of 18 u16.
@pk.func
def dot_q8_Q4_0_pair(w: Ptr[u32, "ro"], wrow: i32, pair: i32, part: i32, xq: Ptr[u32, "ro"],
                     xrow: i32) -> f32:
    b = wrow + 9 * pair
    w0 = w[b]
    w1 = w[b + 1]
    w2 = w[b + 2]
    w3 = w[b + 3]
    w4 = w[b + 4]
    d0 = f32(pk.bitcast(u16(w0 & u32(0xFFFF)), f16))
    d1 = f32(pk.bitcast(u16(w4 >> u32(16)), f16))
    v0 = shifted16(w0, w1)
    v1 = shifted16(w1, w2)
    v2 = shifted16(w2, w3)
    v3 = shifted16(w3, w4)
    x = xrow + 18 * pair
    dx0, sx0 = act_scale(xq, x)
    dx1, sx1 = act_scale(xq, x + 9)
    s0 = nibble_dot(v0, v1, v2, v3, xq, x + 1, 0, u32(0)) + \
        nibble_dot(v0, v1, v2, v3, xq, x + 5, 0, u32(4))
    u0 = w[b + 5]
    u1 = w[b + 6]
    u2 = w[b + 7]
    u3 = w[b + 8]
    s1 = nibble_dot(u0, u1, u2, u3, xq, x + 10, 0, u32(0)) + \
        nibble_dot(u0, u1, u2, u3, xq, x + 14, 0, u32(4))
    return d0 * (dx0 * f32(s0) - 8.0 * sx0) + d1 * (dx1 * f32(s1) - 8.0 * sx1)


# Q8_0 block pair (68 B = 17 u32): word 0 = d0 | qs0[0:2], words 1-7 = qs0[2:30],
# word 8 = qs0[30:32] | d1, words 9-16 = qs1. One item = two blocks.
@pk.func
def dot_q8_Q8_0_pair(w: Ptr[u32, "ro"], wrow: i32, pair: i32, part: i32, xq: Ptr[u32, "ro"],
                     xrow: i32) -> f32:
    b = wrow + 17 * pair
    x = xrow + 18 * pair
    s0 = i32(0)
    prev = w[b]
    d0 = f32(pk.bitcast(u16(prev & u32(0xFFFF)), f16))
    for k in pk.static_range(8):
        nxt = w[b + 1 + k]
        s0 = pk.dp4a(pk.bitcast(shifted16(prev, nxt), i32), act(xq, x + 1 + k), s0)
        prev = nxt
    d1 = f32(pk.bitcast(u16(prev >> u32(16)), f16))
    s1 = i32(0)
    for k in pk.static_range(8):
        s1 = pk.dp4a(pk.bitcast(w[b + 9 + k], i32), act(xq, x + 10 + k), s1)
    dx0, sx0 = act_scale(xq, x)
    dx1, sx1 = act_scale(xq, x + 9)
    return d0 * dx0 * f32(s0) + d1 * dx1 * f32(s1)
