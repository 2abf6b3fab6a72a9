"""Decode eight consecutive K-quant weights to float32, and the `decode8` dispatch over all
formats (see decode8.py for the contract). Super-blocks hold 256 values; o = k % 256."""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u16, u32

from .decode8 import (BF16_WORDS, F16_WORDS, affine_values, byte_of, decode8_halves,
                      decode8_legacy, decode8_legacy_aligned, decode8_plain, scale_min_k4)
from .dot_q8 import half16, pair16
from .mxfp4 import decode8_mxfp4
from .formats import BF16, F16, F32, MXFP4, Q2_K, Q3_K, Q4_1, Q4_K, Q5_1, Q5_K, Q6_K


@pk.func
def decode8_q2k(w: Ptr[u32, "ro"], wrow: i32, k: i32):
    # Q2_K (84 B = 21 u32): scales:16 B | qs:64 B | d:f16 | dmin:f16; x = d*(sc&15)*q - dmin*(sc>>4)
    b = wrow + 21 * (k // 256)
    o = k % 256
    n = o // 128
    j = (o % 128) // 32
    l0 = o % 32
    q = b + 4 + 8 * n + l0 // 4
    sidx = 8 * n + 2 * j + l0 // 16
    sc = byte_of(w[b + sidx // 4], sidx % 4)
    d, dmin = pk.unpack_f16x2(w[b + 20])
    return affine_values(w[q], w[q + 1], u32(2 * j), u32(3), u32(0), u32(0), 0,
                         d * f32(sc & u32(15)), -(dmin * f32(sc >> u32(4))))


@pk.func
def decode8_q3k(w: Ptr[u16, "ro"], wrow: i32, k: i32):
    # Q3_K (110 B = 55 u16): hmask:32 B | qs:64 B | scales:12 B | d:f16;
    # q = ((qs >> 2j) & 3) - (hmask bit (4n + j) set ? 0 : 4), scale 6-bit minus 32
    b = wrow + 55 * (k // 256)
    o = k % 256
    n = o // 128
    j = (o % 128) // 32
    l0 = o % 32
    q0 = pair16(w, b + 16 + 16 * n + l0 // 2)
    q1 = pair16(w, b + 18 + 16 * n + l0 // 2)
    h0 = pair16(w, b + l0 // 2)
    h1 = pair16(w, b + 2 + l0 // 2)
    s = 8 * n + 2 * j + l0 // 16
    lo_byte = (u32(w[b + 48 + (s % 8) // 2]) >> u32(8 * (s % 2))) & u32(0xFF)
    hi_byte = (u32(w[b + 52 + (s % 4) // 2]) >> u32(8 * (s % 2))) & u32(0xFF)
    scale = i32(((lo_byte >> u32(4 * n)) & u32(15)) | (((hi_byte >> u32(2 * (s // 4))) & u32(3))
                                                        << u32(4))) - 32
    dl = half16(w, b + 54) * f32(scale)
    out = pk.local_array(f32, 8)
    for t in pk.static_range(8):
        qw = q0 if t < 4 else q1
        hw = h0 if t < 4 else h1
        qv = i32((qw >> u32(8 * (t % 4) + 2 * j)) & u32(3))
        hb = (hw >> u32(8 * (t % 4) + 4 * n + j)) & u32(1)
        out[t] = dl * f32(qv - (0 if hb != u32(0) else 4))
    return out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7]


@pk.func
def decode8_q45k(FMT: Const[int], w: Ptr[u32, "ro"], wrow: i32, k: i32):
    # Q4_K (144 B = 36 u32): d | dmin | scales:12 B | qs:128 B
    # Q5_K (176 B = 44 u32): d | dmin | scales:12 B | qh:32 B | qs:128 B
    words = 36 if FMT == Q4_K else 44
    qs_at = 4 if FMT == Q4_K else 12
    b = wrow + words * (k // 256)
    o = k % 256
    c = o // 64
    hi = (o % 64) // 32
    l0 = o % 32
    sc, m = scale_min_k4(w[b + 1], w[b + 2], w[b + 3], 2 * c + hi)
    d, dmin = pk.unpack_f16x2(w[b])
    q = b + qs_at + 8 * c + l0 // 4
    top = u32(0)
    if FMT == Q5_K:  # bit (2c + hi) of qh[l] is the 5th bit; gather the 8 bits of l0..l0+7
        for t in pk.static_range(8):
            word = w[b + 4 + l0 // 4 + t // 4]
            top = top | (((word >> u32(8 * (t % 4) + 2 * c + hi)) & u32(1)) << u32(t))
    return affine_values(w[q], w[q + 1], u32(4 * hi), u32(15), top, u32(0), 0, d * sc,
                         -(dmin * m))


@pk.func
def decode8_q6k(w: Ptr[u16, "ro"], wrow: i32, k: i32):
    # Q6_K (210 B = 105 u16): ql:128 B | qh:64 B | scales:i8[16] | d:f16
    b = wrow + 105 * (k // 256)
    o = k % 256
    n = o // 128
    g = (o % 128) // 32
    l0 = o % 32
    ql = b + 32 * n + 16 * (g % 2) + l0 // 2
    l_lo = pair16(w, ql)
    l_hi = pair16(w, ql + 2)
    qh = b + 64 + 16 * n + l0 // 2
    h_lo = pair16(w, qh)
    h_hi = pair16(w, qh + 2)
    s = 8 * n + 2 * g + l0 // 16
    sc = i32(u32(w[b + 96 + s // 2]) << u32(24 - 8 * (s % 2))) >> 24
    dl = half16(w, b + 104) * f32(sc)
    out = pk.local_array(f32, 8)
    for t in pk.static_range(8):
        lw = l_lo if t < 4 else l_hi
        hw = h_lo if t < 4 else h_hi
        lo = (lw >> u32(8 * (t % 4) + 4 * (g // 2))) & u32(15)
        hib = (hw >> u32(8 * (t % 4) + 2 * g)) & u32(3)
        out[t] = dl * f32(i32(lo | (hib << u32(4))) - 32)
    return out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7]


@pk.func
def decode8(FMT: Const[int], w: Ptr[u32, "ro"], wrow: i32, k: i32):
    """Elements k..k+7 of the row at word wrow as 8 f32 (FMT: ggml type id). One comparison per
    branch: each is folded at compile time, so only the taken branch is compiled."""
    if FMT == F32:
        return decode8_plain(FMT, w, wrow, k)
    elif FMT == F16:
        return decode8_plain(FMT, w, wrow, k)
    elif FMT == BF16:
        return decode8_plain(FMT, w, wrow, k)
    elif FMT == F16_WORDS:
        return decode8_halves(FMT, w, wrow, k)
    elif FMT == BF16_WORDS:
        return decode8_halves(FMT, w, wrow, k)
    elif FMT == Q4_1:
        return decode8_legacy_aligned(FMT, w, wrow, k)
    elif FMT == Q5_1:
        return decode8_legacy_aligned(FMT, w, wrow, k)
    elif FMT == Q2_K:
        return decode8_q2k(w, wrow, k)
    elif FMT == Q3_K:
        return decode8_q3k(w, wrow, k)
    elif FMT == Q4_K:
        return decode8_q45k(FMT, w, wrow, k)
    elif FMT == Q5_K:
        return decode8_q45k(FMT, w, wrow, k)
    elif FMT == Q6_K:
        return decode8_q6k(w, wrow, k)
    elif FMT == MXFP4:   # u8 words (17-byte blocks)
        return decode8_mxfp4(w, wrow, k)
    else:  # Q4_0, Q5_0, Q8_0, Q1_0
        return decode8_legacy(FMT, w, wrow, k)
