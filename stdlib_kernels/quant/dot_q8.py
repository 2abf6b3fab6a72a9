"""DP4A dot products of one "item" of a GGUF weight row with Q8_1 activations (device functions),
legacy 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and Q1_0; K-quants: dot_q8_k*.py.

Each `dot_q8_<TYPE>(w, wrow, blk, part, xq, xstride, acc, a0, BATCH)` loads item `part` of
weight block `blk` of the row that starts at word `wrow` of `w` once, then for every token
bt < BATCH adds its dot product with that token's Q8_1 row (starting at word bt * xstride of
`xq`; Q8_1 block = 9 u32 words: d | s << 16, then 32 int8) to acc[a0 + bt]. Loading the weights
once and applying them to all tokens is what makes batched decode cost about one weight read.
Weights come as u32 words where every block (or block pair) is 4-byte aligned and as u16 words
otherwise. The Q8_1 `s` is the block's sum (d sum(q), q8_1.py), so constant offsets such as
Q4_0's -8 or Q4_1's m cost one multiply per block instead of a dp4a.
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f16, f32, i32, u16, u32, u64

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
def act_copy(xq: Ptr[u32, "ro"], x: i32, a, WORDS: Const[int], VEC: Const[int]):
    """a[0..WORDS) = xq[x..x+WORDS): VEC-word vector loads (x and WORDS multiples of VEC, the
    row 4 VEC-byte aligned: the host checks), or scalar loads for VEC = 1. Consecutive Q8_1
    blocks are 36 bytes apart, so 2 blocks start 8-byte aligned and 4 blocks 16-byte aligned."""
    for v in pk.static_range(WORDS // VEC):
        if VEC == 4:
            a0, a1, a2, a3 = pk.load_vec(xq, x + 4 * v, 4)
            a[4 * v] = a0
            a[4 * v + 1] = a1
            a[4 * v + 2] = a2
            a[4 * v + 3] = a3
        elif VEC == 2:
            a0, a1 = pk.load_vec(xq, x + 2 * v, 2)
            a[2 * v] = a0
            a[2 * v + 1] = a1
        else:
            a[v] = xq[x + v]


@pk.func
def nibble_dot(v0: u32, v1: u32, v2: u32, v3: u32, xq: Ptr[u32, "ro"], lo: i32,
               shift: u32) -> i32:
    """sum over 16 values of ((v >> shift) & 15) * the int8 activations at words lo..lo+3."""
    s = pk.dp4a((v0 >> shift) & LOW_NIBBLES, act(xq, lo), 0)
    s = pk.dp4a((v1 >> shift) & LOW_NIBBLES, act(xq, lo + 1), s)
    s = pk.dp4a((v2 >> shift) & LOW_NIBBLES, act(xq, lo + 2), s)
    return pk.dp4a((v3 >> shift) & LOW_NIBBLES, act(xq, lo + 3), s)


@pk.func
def bits_to_bytes(nib: u32) -> u32:
    """Four bits -> four bytes of 0/1 (bit t -> byte t): the shifted copies never overlap."""
    return (nib * u32(0x00204081)) & u32(0x01010101)


@pk.func
def funnel16(lo: u32, hi: u32, shift: u32) -> u32:
    """The 4 bytes starting shift / 8 bytes into lo (shift 0, 16 or 32), continuing into hi."""
    return u32((u64(lo) | (u64(hi) << u64(32))) >> u64(shift))


@pk.func
def shifted16(a: u32, b: u32) -> u32:
    """The 4 bytes starting 2 bytes into a (a's high half, then b's low half)."""
    return (a >> u32(16)) | (b << u32(16))


@pk.func
def fifth_bit_dot(v0: u32, v1: u32, v2: u32, v3: u32, qh: u32, xq: Ptr[u32, "ro"], x: i32) -> i32:
    """Q5_0/Q5_1: sum over 32 values q = nibble | (qh bit j) << 4 times the activations of the
    Q8_1 block at word x (values j < 16: low nibbles, qh bits 0..15; j >= 16: high, bits 16..)."""
    s = i32(0)
    for k in pk.static_range(4):
        v = v0 if k == 0 else (v1 if k == 1 else (v2 if k == 2 else v3))
        lo = (v & LOW_NIBBLES) | (bits_to_bytes((qh >> u32(4 * k)) & u32(15)) << u32(4))
        hi = ((v >> u32(4)) & LOW_NIBBLES) | \
            (bits_to_bytes((qh >> u32(16 + 4 * k)) & u32(15)) << u32(4))
        s = pk.dp4a(lo, act(xq, x + 1 + k), s)
        s = pk.dp4a(hi, act(xq, x + 5 + k), s)
    return s


# Q4_0 block (18 B = 9 u16): d:f16 | qs:16 B; x[j] = (qs[j] & 15) - 8, x[j+16] = (qs[j] >> 4) - 8
@pk.func
def dot_q8_Q4_0(w: Ptr[u16, "ro"], wrow: i32, blk: i32, part: i32, xq: Ptr[u32, "ro"],
                xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    b = wrow + 9 * blk
    d = half16(w, b)
    v0 = pair16(w, b + 1)
    v1 = pair16(w, b + 3)
    v2 = pair16(w, b + 5)
    v3 = pair16(w, b + 7)
    for bt in pk.static_range(BATCH):
        x = bt * xstride + 9 * blk
        dx, sx = act_scale(xq, x)
        s = nibble_dot(v0, v1, v2, v3, xq, x + 1, u32(0)) + \
            nibble_dot(v0, v1, v2, v3, xq, x + 5, u32(4))
        acc[a0 + bt] += d * (dx * f32(s) - 8.0 * sx)


@pk.func
def pair_scales(first: u32, middle: u32):
    """(d0, d1) of a block pair of 2-byte-aligned blocks read as u32 words (Q4_0, Q8_0): d0
    the low half of the pair's first word, d1 the high half of the word where the second
    block starts."""
    return (f32(pk.bitcast(u16(first & u32(0xFFFF)), f16)),
            f32(pk.bitcast(u16(middle >> u32(16)), f16)))


# Q4_0 block pair (36 B = 9 u32; rows of an even number of blocks are 4-byte aligned):
# word 0 = d0 | qs0[0:2], words 1-3 = qs0[2:14], word 4 = qs0[14:16] | d1, words 5-8 = qs1.
@pk.func
def dot_q8_Q4_0_pair(w: Ptr[u32, "ro"], wrow: i32, pair: i32, part: i32, xq: Ptr[u32, "ro"],
                     xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int], VEC: Const[int]):
    b = wrow + 9 * pair
    w0 = w[b]
    w1 = w[b + 1]
    w2 = w[b + 2]
    w3 = w[b + 3]
    w4 = w[b + 4]
    u0 = w[b + 5]
    u1 = w[b + 6]
    u2 = w[b + 7]
    u3 = w[b + 8]
    d0, d1 = pair_scales(w0, w4)
    v0 = shifted16(w0, w1)
    v1 = shifted16(w1, w2)
    v2 = shifted16(w2, w3)
    v3 = shifted16(w3, w4)
    a = pk.local_array(u32, 18)   # the two Q8_1 blocks, when loaded by vectors
    for bt in pk.static_range(BATCH):
        x = bt * xstride + 18 * pair
        if VEC == 1:   # scalar loads where they are used
            acc[a0 + bt] += q4_0_pair_sum(d0, d1, v0, v1, v2, v3, u0, u1, u2, u3, xq, x)
        else:
            act_copy(xq, x, a, 18, VEC)
            acc[a0 + bt] += q4_0_pair_sum(d0, d1, v0, v1, v2, v3, u0, u1, u2, u3, a, 0)


@pk.func
def q4_0_pair_sum(d0: f32, d1: f32, v0: u32, v1: u32, v2: u32, v3: u32, u0: u32, u1: u32,
                  u2: u32, u3: u32, xs, x: i32) -> f32:
    """A Q4_0 block pair (quants v, u) against the two Q8_1 blocks at word x of xs."""
    dx0, sx0 = act_scale(xs, x)
    dx1, sx1 = act_scale(xs, x + 9)
    s0 = nibble_dot(v0, v1, v2, v3, xs, x + 1, u32(0)) + \
        nibble_dot(v0, v1, v2, v3, xs, x + 5, u32(4))
    s1 = nibble_dot(u0, u1, u2, u3, xs, x + 10, u32(0)) + \
        nibble_dot(u0, u1, u2, u3, xs, x + 14, u32(4))
    return d0 * (dx0 * f32(s0) - 8.0 * sx0) + d1 * (dx1 * f32(s1) - 8.0 * sx1)


@pk.func
def q4_0_half_dot(w: Ptr[u32, "ro"], wrow: i32, sb: i32, n: i32, a) -> f32:
    """Values 128 n .. 128 n + 127 of the 256 at word 36 sb of the row at word wrow (8 Q4_0
    blocks: 144 bytes, a 16-byte multiple; its halves are two block pairs) times the 4 Q8_1
    blocks' 36 words in a. For the bulk-copy GEMV (rows in shared memory)."""
    r = f32(0.0)
    for p in pk.static_range(2):
        b = wrow + 36 * sb + 18 * n + 9 * p
        w0 = w[b]
        w4 = w[b + 4]
        d0, d1 = pair_scales(w0, w4)
        r += q4_0_pair_sum(d0, d1, shifted16(w0, w[b + 1]), shifted16(w[b + 1], w[b + 2]),
                           shifted16(w[b + 2], w[b + 3]), shifted16(w[b + 3], w4), w[b + 5],
                           w[b + 6], w[b + 7], w[b + 8], a, 18 * p)
    return r


# Q4_1 block (20 B = 5 u32): d:f16 | m:f16 | qs:16 B; x = q*d + m
@pk.func
def dot_q8_Q4_1(w: Ptr[u32, "ro"], wrow: i32, blk: i32, part: i32, xq: Ptr[u32, "ro"],
                xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    b = wrow + 5 * blk
    d, m = pk.unpack_f16x2(w[b])
    v0 = w[b + 1]
    v1 = w[b + 2]
    v2 = w[b + 3]
    v3 = w[b + 4]
    for bt in pk.static_range(BATCH):
        x = bt * xstride + 9 * blk
        dx, sx = act_scale(xq, x)
        s = nibble_dot(v0, v1, v2, v3, xq, x + 1, u32(0)) + \
            nibble_dot(v0, v1, v2, v3, xq, x + 5, u32(4))
        acc[a0 + bt] += d * dx * f32(s) + m * sx


@pk.func
def q4_1_half_dot(w: Ptr[u32, "ro"], wrow: i32, sb: i32, n: i32, a) -> f32:
    """Values 128 n .. 128 n + 127 of the 256 at word 40 sb of the row at word wrow (8 Q4_1
    blocks: 160 bytes) times the 4 Q8_1 blocks' 36 words in a (the bulk-copy GEMV)."""
    r = f32(0.0)
    for j in pk.static_range(4):
        b = wrow + 40 * sb + 20 * n + 5 * j
        d, m = pk.unpack_f16x2(w[b])
        v0 = w[b + 1]
        v1 = w[b + 2]
        v2 = w[b + 3]
        v3 = w[b + 4]
        dx, sx = act_scale(a, 9 * j)
        s = nibble_dot(v0, v1, v2, v3, a, 9 * j + 1, u32(0)) + \
            nibble_dot(v0, v1, v2, v3, a, 9 * j + 5, u32(4))
        r += d * dx * f32(s) + m * sx
    return r


# Q5_0 block (22 B = 11 u16): d:f16 | qh:u32 | qs:16 B; x = (q - 16) * d
@pk.func
def dot_q8_Q5_0(w: Ptr[u16, "ro"], wrow: i32, blk: i32, part: i32, xq: Ptr[u32, "ro"],
                xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    b = wrow + 11 * blk
    d = half16(w, b)
    qh = pair16(w, b + 1)
    v0 = pair16(w, b + 3)
    v1 = pair16(w, b + 5)
    v2 = pair16(w, b + 7)
    v3 = pair16(w, b + 9)
    for bt in pk.static_range(BATCH):
        x = bt * xstride + 9 * blk
        dx, sx = act_scale(xq, x)
        s = fifth_bit_dot(v0, v1, v2, v3, qh, xq, x)
        acc[a0 + bt] += d * (dx * f32(s) - 16.0 * sx)


# Q5_1 block (24 B = 6 u32): d:f16 | m:f16 | qh:u32 | qs:16 B; x = q*d + m
@pk.func
def dot_q8_Q5_1(w: Ptr[u32, "ro"], wrow: i32, blk: i32, part: i32, xq: Ptr[u32, "ro"],
                xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    b = wrow + 6 * blk
    d, m = pk.unpack_f16x2(w[b])
    qh = w[b + 1]
    v0 = w[b + 2]
    v1 = w[b + 3]
    v2 = w[b + 4]
    v3 = w[b + 5]
    for bt in pk.static_range(BATCH):
        x = bt * xstride + 9 * blk
        dx, sx = act_scale(xq, x)
        s = fifth_bit_dot(v0, v1, v2, v3, qh, xq, x)
        acc[a0 + bt] += d * dx * f32(s) + m * sx


# Q8_0 block (34 B = 17 u16): d:f16 | qs:i8[32]; x = q*d
@pk.func
def dot_q8_Q8_0(w: Ptr[u16, "ro"], wrow: i32, blk: i32, part: i32, xq: Ptr[u32, "ro"],
                xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    b = wrow + 17 * blk
    d = half16(w, b)
    q = pk.local_array(u32, 8)
    for k in pk.static_range(8):
        q[k] = pair16(w, b + 1 + 2 * k)
    for bt in pk.static_range(BATCH):
        x = bt * xstride + 9 * blk
        s = i32(0)
        for k in pk.static_range(8):
            s = pk.dp4a(pk.bitcast(q[k], i32), act(xq, x + 1 + k), s)
        dx, sx = act_scale(xq, x)
        acc[a0 + bt] += d * dx * f32(s)


# Q8_0 block pair (68 B = 17 u32): word 0 = d0 | qs0[0:2], words 1-7 = qs0[2:30],
# word 8 = qs0[30:32] | d1, words 9-16 = qs1.
@pk.func
def dot_q8_Q8_0_pair(w: Ptr[u32, "ro"], wrow: i32, pair: i32, part: i32, xq: Ptr[u32, "ro"],
                     xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int], VEC: Const[int]):
    b = wrow + 17 * pair
    raw = pk.local_array(u32, 17)
    for k in pk.static_range(17):
        raw[k] = w[b + k]
    d0, d1 = pair_scales(raw[0], raw[8])
    a = pk.local_array(u32, 18)   # the two Q8_1 blocks, when loaded by vectors
    for bt in pk.static_range(BATCH):
        x = bt * xstride + 18 * pair
        if VEC == 1:   # scalar loads where they are used
            acc[a0 + bt] += q8_0_pair_sum(d0, d1, raw, xq, x)
        else:
            act_copy(xq, x, a, 18, VEC)
            acc[a0 + bt] += q8_0_pair_sum(d0, d1, raw, a, 0)


@pk.func
def q8_0_pair_sum(d0: f32, d1: f32, raw, xs, x: i32) -> f32:
    """A Q8_0 block pair (17 raw words) against the two Q8_1 blocks at word x of xs."""
    s0 = i32(0)
    s1 = i32(0)
    for k in pk.static_range(8):
        s0 = pk.dp4a(pk.bitcast(shifted16(raw[k], raw[k + 1]), i32), act(xs, x + 1 + k), s0)
        s1 = pk.dp4a(pk.bitcast(raw[9 + k], i32), act(xs, x + 10 + k), s1)
    dx0, sx0 = act_scale(xs, x)
    dx1, sx1 = act_scale(xs, x + 9)
    return d0 * dx0 * f32(s0) + d1 * dx1 * f32(s1)


@pk.func
def q8_0_half_dot(w: Ptr[u32, "ro"], wrow: i32, sb: i32, n: i32, a) -> f32:
    """Values 128 n .. 128 n + 127 of the 256 at word 68 sb of the row at word wrow (8 Q8_0
    blocks: 272 bytes, so such a run starts 16-byte aligned; its halves are two block pairs)
    times the 4 Q8_1 blocks' 36 words in a. For the bulk-copy GEMV (rows in shared memory)."""
    r = f32(0.0)
    for p in pk.static_range(2):
        b = wrow + 68 * sb + 34 * n + 17 * p
        raw = pk.local_array(u32, 17)
        for k in pk.static_range(17):
            raw[k] = w[b + k]
        d0, d1 = pair_scales(raw[0], raw[8])
        r += q8_0_pair_sum(d0, d1, raw, a, 18 * p)
    return r


# Q1_0 block (18 B = 9 u16): d:f16 | 128 sign bits. Item `part` (4 per block) = values
# 32 part .. 32 part + 31 = Q8_1 block 4 blk + part: sum(+-d x) = d (2 sum_{bit set} x - sum x).
@pk.func
def dot_q8_Q1_0(w: Ptr[u16, "ro"], wrow: i32, blk: i32, part: i32, xq: Ptr[u32, "ro"],
                xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    b = wrow + 9 * blk
    d = half16(w, b)
    bits = pair16(w, b + 1 + 2 * part)
    for bt in pk.static_range(BATCH):
        x = bt * xstride + 9 * (4 * blk + part)
        s = i32(0)
        for k in pk.static_range(8):
            s = pk.dp4a(bits_to_bytes((bits >> u32(4 * k)) & u32(15)), act(xq, x + 1 + k), s)
        dx, sx = act_scale(xq, x)
        acc[a0 + bt] += d * (2.0 * dx * f32(s) - sx)


# Q1_0 rows of an even number of 18-byte blocks read as u32 words (4-byte aligned; block blk
# starts 2 (blk % 2) bytes into word 9 blk / 2).
@pk.func
def q1_0_block_words(w: Ptr[u32, "ro"], wrow: i32, blk: i32, bits) -> f32:
    """d of Q1_0 block blk of a u32-word row; its 128 sign bits to bits[0..4) (5 loads)."""
    wb = wrow + (9 * blk) // 2
    shift = u32(16) * u32(blk % 2)
    raw = pk.local_array(u32, 5)
    for k in pk.static_range(5):
        raw[k] = w[wb + k]
    for k in pk.static_range(4):
        bits[k] = funnel16(raw[k], raw[k + 1], shift + u32(16))
    return f32(pk.bitcast(u16((raw[0] >> shift) & u32(0xFFFF)), f16))


# Q1_0 by bit planes, one item per block (its 4 Q8_1 blocks by 16-byte loads: 16-byte aligned
# Q8_1 rows) for all ROWS rows of the group (and W2's in the GLU modes): plane j of a bit word
# ((bits >> j) & 0x01010101: values j, 8 + j, 16 + j, 24 + j) is dotted with the activation
# bytes gathered in that order (byte_planes, built once per item and token for all rows):
# 3 operations per 4 values and row instead of bits_to_bytes' 5. PRMT: the
# gathers by prmt (GPU only) instead of shifts and masks.
@pk.func
def dot_q8_Q1_0_rows(w: Ptr[u32, "ro"], w2: Ptr[u32, "ro"], wrows, blk: i32,
                     xq: Ptr[u32, "ro"], xstride: i32, acc: Ptr[f32], ROWS: Const[int],
                     BATCH: Const[int], GLU: Const[bool], PRMT: Const[bool]):
    a = pk.local_array(u32, 36)
    t = pk.local_array(u32, 32)
    dx2 = pk.local_array(f32, 4)
    for bt in pk.static_range(BATCH):
        act_copy(xq, bt * xstride + 36 * blk, a, 36, 4)
        sxs = f32(0.0)
        for p in pk.static_range(4):
            byte_planes(a, 9 * p + 1, t, 8 * p, PRMT)
            dx, sx = act_scale(a, 9 * p)
            dx2[p] = 2.0 * dx
            sxs += sx
        for ri in pk.static_range(ROWS):
            q1_0_planes_dot(w, wrows[ri], blk, t, dx2, sxs, acc, ri * BATCH + bt)
            if GLU:
                q1_0_planes_dot(w2, wrows[ri], blk, t, dx2, sxs, acc, (ROWS + ri) * BATCH + bt)


@pk.func
def q1_0_planes_dot(w: Ptr[u32, "ro"], wrow: i32, blk: i32, t, dx2, sxs: f32, acc: Ptr[f32],
                    a: i32):
    """acc[a] += block blk of the row at word wrow . the activations (planes t, 2 dx, sum s):
    sum(+-d x) = d (2 sum_{bit set} x - sum x)."""
    bits = pk.local_array(u32, 4)
    d = q1_0_block_words(w, wrow, blk, bits)
    r = f32(0.0)
    for p in pk.static_range(4):
        s = i32(0)
        for j in pk.static_range(8):
            s = pk.dp4a((bits[p] >> u32(j)) & u32(0x01010101), pk.bitcast(t[8 * p + j], i32), s)
        r += dx2[p] * f32(s)
    acc[a] += d * (r - sxs)


@pk.func
def byte_planes(a, o: i32, t, t0: Const[int], PRMT: Const[bool]):
    """t[t0 + j] = activation bytes j, 8 + j, 16 + j, 24 + j of the 8 words a[o..o+8) (bytes j
    of words 0, 2, 4, 6 for j < 4; bytes j - 4 of words 1, 3, 5, 7 for j >= 4)."""
    for odd in pk.static_range(2):
        if PRMT:
            transpose4_prmt(a[o + odd], a[o + 2 + odd], a[o + 4 + odd], a[o + 6 + odd], t,
                            t0 + 4 * odd)
        else:
            transpose4(a[o + odd], a[o + 2 + odd], a[o + 4 + odd], a[o + 6 + odd], t,
                       t0 + 4 * odd)


@pk.func
def transpose4(r0: u32, r1: u32, r2: u32, r3: u32, t, t0: Const[int]):
    """t[t0 + i] = bytes i of r0, r1, r2, r3 (a 4 x 4 byte transpose)."""
    u = (r0 & u32(0x00FF00FF)) | ((r1 & u32(0x00FF00FF)) << u32(8))
    v = ((r0 >> u32(8)) & u32(0x00FF00FF)) | (r1 & u32(0xFF00FF00))
    u2 = (r2 & u32(0x00FF00FF)) | ((r3 & u32(0x00FF00FF)) << u32(8))
    v2 = ((r2 >> u32(8)) & u32(0x00FF00FF)) | (r3 & u32(0xFF00FF00))
    t[t0] = (u & u32(0xFFFF)) | (u2 << u32(16))
    t[t0 + 1] = (v & u32(0xFFFF)) | (v2 << u32(16))
    t[t0 + 2] = (u >> u32(16)) | (u2 & u32(0xFFFF0000))
    t[t0 + 3] = (v >> u32(16)) | (v2 & u32(0xFFFF0000))


@pk.func
def prmt(a: u32, b: u32, sel: u32) -> u32:
    """Bytes of (b:a) picked by the selector's nibbles (PTX prmt.b32, GPU only)."""
    return pk.asm("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", u32, a, b, sel)


@pk.func
def transpose4_prmt(r0: u32, r1: u32, r2: u32, r3: u32, t, t0: Const[int]):
    """transpose4 in 8 prmt: interleave bytes of (r0, r1) and (r2, r3), then their halves."""
    x01 = prmt(r0, r1, u32(0x5140))
    x23 = prmt(r0, r1, u32(0x7362))
    y01 = prmt(r2, r3, u32(0x5140))
    y23 = prmt(r2, r3, u32(0x7362))
    t[t0] = prmt(x01, y01, u32(0x5410))
    t[t0 + 1] = prmt(x01, y01, u32(0x7632))
    t[t0 + 2] = prmt(x23, y23, u32(0x5410))
    t[t0 + 3] = prmt(x23, y23, u32(0x7632))
