"""One thread's share of dequant_f16's output (device functions, inlined into dequant_f16_flat).

The weights are read as a flat run of blocks (rows are stored back to back, so value v of the
whole matrix is value v % 256 of super-block v // 256). A group of 8 threads (lanes j = 0..7)
writes one 256-value span (512 B of f16): lane j writes values 64 p + 8 j .. + 7 for p = 0..3,
one 16-byte store per p, so the 8 lanes of a store instruction fill one whole 128-byte line.

    lane_q45k  Q4_K / Q5_K (super-blocks 16-byte aligned): the 16-byte header (d | dmin | 12
               scale bytes) in one vector load, the 8 quant bytes of each p in one 8-byte load
               (Q5_K: its 8 fifth-bit bytes once), each (scale, min) decoded once per 8 values
               by byte selects known at compile time (no divergent branch).
    lane_q6k   Q6_K (210-byte super-blocks, 2-byte aligned: u16 loads): lane j's 32 values take
               8 low-bit and 8 high-bit bytes per half super-block (both nibbles of the same
               bytes), 4 scale words and d: 21 u16 loads instead of decode8's 40.
    lane_generic  every other format: decode8 four times (the header re-read per 8 values).

Values are the f32 of decode8 (the same products, in the same order, as quant.reference's
dequantizers) rounded to nearest f16 by pack_f16x2.
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u16, u32

from .decode8_k import decode8
from .dot_q8 import half16, pair16
from .formats import Q4_1, Q4_K

Q45K_WORDS = {"Q4_K": 36, "Q5_K": 44}      # super-block size in u32 words
Q6K_HALFS = 105                            # Q6_K super-block in u16 words


@pk.func
def store8(out: Ptr[u32], word: i32, v0: f32, v1: f32, v2: f32, v3: f32, v4: f32, v5: f32,
           v6: f32, v7: f32):
    """Eight f32 as f16 into out words word..word+3 (one 16-byte store)."""
    pk.store_vec(out, word, (pk.pack_f16x2(v0, v1), pk.pack_f16x2(v2, v3),
                             pk.pack_f16x2(v4, v5), pk.pack_f16x2(v6, v7)))


@pk.func
def small_int_f32(q: u32, offset: f32) -> f32:
    """f32(q) - offset, exactly, for 0 <= q < 2^22 and a small integer offset: q in the low
    mantissa bits of 2^23 minus (2^23 + offset). Both steps are exact, so this equals
    f32(i32(q) - offset) bit for bit; an FADD instead of an int-to-float conversion (I2F issues
    at a quarter or less of the FP32 rate)."""
    return pk.bitcast(q | u32(0x4B000000), f32) - (f32(8388608.0) + offset)


@pk.func
def scale_min_q45k(s0: u32, s1: u32, s2: u32, h: i32, P: Const[int]):
    """ggml's get_scale_min_k4 for sub-block 2 P + h (P compile-time, h = 0 or 1) of the 12
    scale bytes s0 | s1 | s2: P < 2 reads bytes 2P + h of s0 (scale) and s1 (min); P >= 2 the low
    / high nibble of byte 2(P-2) + h of s2 with the top 2 bits of the same byte of s0 / s1."""
    if P < 2:
        at = u32(16 * P) + u32(8) * u32(h)
        return f32((s0 >> at) & u32(63)), f32((s1 >> at) & u32(63))
    else:
        at = u32(16 * (P - 2)) + u32(8) * u32(h)
        low = s2 >> at
        sc = (low & u32(15)) | (((s0 >> at) >> u32(6)) & u32(3)) << u32(4)
        m = ((low >> u32(4)) & u32(15)) | (((s1 >> at) >> u32(6)) & u32(3)) << u32(4)
        return f32(sc), f32(m)


@pk.func
def lane_q45k(FMT: Const[int], w: Ptr[u32, "ro"], out: Ptr[u32], span: i32, j: i32):
    # Q4_K (36 u32): d | dmin | scales:12 B | qs:128 B; Q5_K (44 u32): ... | qh:32 B | qs:128 B.
    # Lane j (h = j // 4, q = j % 4), store p: values 64 p + 32 h + 8 q.. of the super-block =
    # nibble h of qs bytes 32 p + 8 q .. + 7 (sub-block 2 p + h); Q5_K's fifth bit: bit 2 p + h
    # of qh bytes 8 q .. + 7.
    b = span * (36 if FMT == Q4_K else 44)
    qs_at = 4 if FMT == Q4_K else 12
    h = j // 4
    q = j % 4
    head, s0, s1, s2 = pk.load_vec(w, b, 4)
    d, dmin = pk.unpack_f16x2(head)
    top = pk.local_array(u32, 2)
    if FMT != Q4_K:
        t0, t1 = pk.load_vec(w, b + 4 + 2 * q, 2)
        top[0] = t0
        top[1] = t1
    nib = u32(4) * u32(h)
    for p in pk.static_range(4):
        lo, hi = pk.load_vec(w, b + qs_at + 8 * p + 2 * q, 2)
        sc, mn = scale_min_q45k(s0, s1, s2, h, p)
        d1 = d * sc
        m1 = -(dmin * mn)
        nibbles = pk.local_array(u32, 2)             # this lane's nibbles at bits 8t .. 8t + 3
        nibbles[0] = (lo >> nib) & u32(0x0F0F0F0F)
        nibbles[1] = (hi >> nib) & u32(0x0F0F0F0F)
        if FMT != Q4_K:                              # fifth bits to bit 8t + 4
            at = u32(2 * p) + u32(h)
            nibbles[0] = nibbles[0] | (((top[0] >> at) & u32(0x01010101)) << u32(4))
            nibbles[1] = nibbles[1] | (((top[1] >> at) & u32(0x01010101)) << u32(4))
        vals = pk.local_array(f32, 8)
        for t in pk.static_range(8):
            qv = (nibbles[t // 4] >> u32(8 * (t % 4))) & u32(0xFF)
            vals[t] = d1 * small_int_f32(qv, f32(0.0)) + m1
        store8(out, span * 128 + 32 * p + 4 * j, vals[0], vals[1], vals[2], vals[3], vals[4],
               vals[5], vals[6], vals[7])


@pk.func
def lane_q6k(w: Ptr[u16, "ro"], out: Ptr[u32], span: i32, j: i32):
    # Q6_K (105 u16): ql:128 B | qh:64 B | scales:i8[16] | d:f16. Half n (values 128 n ..) of
    # lane j (h = j // 4, q = j % 4): ql bytes 64 n + 32 h + 8 q .. + 7 and qh bytes 32 n + 8 q
    # .. + 7 give group g = h (low nibbles, qh bits 2h: store p = 2n) and g = h + 2 (high
    # nibbles, qh bits 2h + 4: store p = 2n + 1); group g's scale is byte 8n + 2g + q // 2.
    b = span * Q6K_HALFS
    h = j // 4
    q = j % 4
    d = half16(w, b + 104)
    for n in pk.static_range(2):
        ql = pk.local_array(u32, 2)
        qh = pk.local_array(u32, 2)
        for i in pk.static_range(2):
            ql[i] = pair16(w, b + 32 * n + 16 * h + 4 * q + 2 * i)
            qh[i] = pair16(w, b + 64 + 16 * n + 4 * q + 2 * i)
        for half in pk.static_range(2):              # g = h + 2 half
            sword = u32(w[b + 96 + 4 * n + h + 2 * half])
            sc = i32(sword << (u32(24) - u32(8) * u32(q // 2))) >> 24
            dl = d * f32(sc)
            vals = pk.local_array(f32, 8)
            six = pk.local_array(u32, 2)             # 6-bit quants at bits 8t .. 8t + 5
            for i in pk.static_range(2):
                low = (ql[i] >> u32(4 * half)) & u32(0x0F0F0F0F)
                high = (qh[i] >> (u32(4 * half) + u32(2) * u32(h))) & u32(0x03030303)
                six[i] = low | (high << u32(4))
            for t in pk.static_range(8):
                qv = (six[t // 4] >> u32(8 * (t % 4))) & u32(0xFF)
                vals[t] = dl * small_int_f32(qv, f32(32.0))
            p = 2 * n + half
            store8(out, span * 128 + 32 * p + 4 * j, vals[0], vals[1], vals[2], vals[3],
                   vals[4], vals[5], vals[6], vals[7])


@pk.func
def lane_q4_legacy(FMT: Const[int], w: Ptr["WT", "ro"], out: Ptr[u32], span: i32, j: i32,
                   values: i32, WT: Const[pk.dtype]):
    # Q4_0 (9 u16): d:f16 | qs:16 B, (q - 8) d; Q4_1 (5 u32): d | m | qs:16 B, q d + m.
    # Store p of lane j (h = j // 4, q = j % 4): values 8 q .. + 7 of block 2 p + h of the span
    # = nibble q // 2 of qs bytes 8 (q % 2) .. + 7.
    h = j // 4
    q = j % 4
    nib = u32(4) * u32(q // 2)
    for p in pk.static_range(4):
        blk = span * 8 + 2 * p + h
        if blk * 32 < values:
            words = pk.local_array(u32, 2)
            if FMT == Q4_1:
                b = blk * 5
                d, m = pk.unpack_f16x2(w[b])
                # 5-word blocks: the pair starts on an odd word for every other block, so
                # two 4-byte loads (an 8-byte vector load there faults on the GPU)
                words[0] = w[b + 1 + 2 * (q % 2)]
                words[1] = w[b + 2 + 2 * (q % 2)]
            else:
                b = blk * 9
                d = half16(w, b)
                words[0] = pair16(w, b + 1 + 4 * (q % 2))
                words[1] = pair16(w, b + 3 + 4 * (q % 2))
            for i in pk.static_range(2):
                words[i] = (words[i] >> nib) & u32(0x0F0F0F0F)
            vals = pk.local_array(f32, 8)
            for t in pk.static_range(8):
                qv = (words[t // 4] >> u32(8 * (t % 4))) & u32(0xFF)
                if FMT == Q4_1:
                    vals[t] = d * small_int_f32(qv, f32(0.0)) + m
                else:
                    vals[t] = d * small_int_f32(qv, f32(8.0))
            store8(out, span * 128 + 32 * p + 4 * j, vals[0], vals[1], vals[2], vals[3],
                   vals[4], vals[5], vals[6], vals[7])


@pk.func
def lane_generic(FMT: Const[int], w: Ptr[u32, "ro"], out: Ptr[u32], span: i32, j: i32,
                 values: i32):
    """decode8 of values 256 span + 64 p + 8 j .. + 7 for p = 0..3, those below `values` (the
    last span of a 32- or 128-value format may be partial)."""
    for p in pk.static_range(4):
        k = span * 256 + 64 * p + 8 * j
        if k < values:
            v0, v1, v2, v3, v4, v5, v6, v7 = decode8(FMT, w, 0, k)
            store8(out, k // 2, v0, v1, v2, v3, v4, v5, v6, v7)
