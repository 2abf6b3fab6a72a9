"""Eight weights of a GGUF row as four f16 pairs (device functions of gemm_hopper_quant's
dequantizers): `dequant_chunk(words, wrow, v, FMT) -> 4 x u32`, values v..v+7 (v % 8 == 0, v <
256) of the raw row (or slab) at word wrow, each decode8's f32 value rounded to nearest even,
the f16 prefill GEMM's numerics (pack_f16x2(decode8(...))).

Q8_0, Q4_K and Q6_K (the formats of Q8_0 and Q4_K_M files) have versions of their own that give
the same bits without decode8's int -> f32 conversions, which run at a quarter of the f32 rate
on the GPU and would bound the dequantizers: a quant q of at most 23 bits is read as f32 by
placing its byte under the exponent of 2^23 (the bits 0x4B0000qq are the float 2^23 + q) and
subtracting 2^23 (+ the format's offset), exactly; the f32 products and sums are then decode8's
operations in decode8's order. Q8_0 goes further: d x q is exact in f32, so one f16 multiply of
the exact f16 q (1024 + 128 + q from its byte, minus 1152) gives the same single rounding."""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, f32, i32, u32
from stdlib_kernels.quant.decode8 import scale_min_k4
from stdlib_kernels.quant.decode8_k import decode8
from stdlib_kernels.quant.dot_q8 import half16, pair16
from stdlib_kernels.quant.formats import Q4_K, Q6_K, Q8_0

TWO_23 = 8388608.0                          # 2^23: bitcast(0x4B000000 | q) - TWO_23 = q


@pk.func
def byte_f32(word: u32, i: Const[int]) -> f32:
    """Byte i of word as the f32 2^23 + byte (one prmt under 0x4B000000's exponent)."""
    return pk.bitcast(pk.prmt(word, u32(0x4B000000), u32(0x7540 + i)), f32)


@pk.func
def q8_0_chunk(words, wrow: i32, v: i32):
    """Q8_0 (17 u16 a block: d | qs[32]) in f16 arithmetic (module docstring)."""
    b = wrow + 17 * (v // 32)
    qs = b + 1 + (v % 32) // 2
    d = u32(words[b])
    scale = d | (d << u32(16))
    out = pk.local_array(u32, 4)
    for h in pk.static_range(2):
        biased = pair16(words, qs + 2 * h) ^ u32(0x80808080)   # q + 128 in each byte
        for i in pk.static_range(2):
            pair = pk.prmt(biased, u32(0x64646464), u32(0x4140 + 0x202 * i))
            out[2 * h + i] = pk.mul_f16x2(pk.sub_f16x2(pair, u32(0x64806480)), scale)
    return out[0], out[1], out[2], out[3]


@pk.func
def q4k_chunk(words, wrow: i32, v: i32):
    """Q4_K (36 u32 a super-block: d | dmin | scales 12 B | qs 128 B): decode8_q45k's
    (d sc) q + -(dmin m) with q read by byte_f32."""
    b = wrow + 36 * (v // 256)
    o = v % 256
    c, hi = o // 64, (o % 64) // 32
    sc, m = scale_min_k4(words[b + 1], words[b + 2], words[b + 3], 2 * c + hi)
    d, dmin = pk.unpack_f16x2(words[b])
    scale, shift = d * sc, -(dmin * m)
    q = b + 4 + 8 * c + (o % 32) // 4
    out = pk.local_array(u32, 4)
    for h in pk.static_range(2):
        nibbles = (words[q + h] >> u32(4 * hi)) & u32(0x0F0F0F0F)
        for i in pk.static_range(2):
            lo = scale * (byte_f32(nibbles, 2 * i) - TWO_23) + shift
            up = scale * (byte_f32(nibbles, 2 * i + 1) - TWO_23) + shift
            out[2 * h + i] = pk.pack_f16x2(lo, up)
    return out[0], out[1], out[2], out[3]


@pk.func
def q6k_chunk(words, wrow: i32, v: i32):
    """Q6_K (105 u16 a super-block: ql 128 B | qh 64 B | scales i8[16] | d): decode8_q6k's
    (d sc) (q - 32), q = 4 low bits | 2 high bits << 4, read by byte_f32 minus 2^23 + 32."""
    b = wrow + 105 * (v // 256)
    o = v % 256
    n, g, l0 = o // 128, (o % 128) // 32, o % 32
    ql = b + 32 * n + 16 * (g % 2) + l0 // 2
    qh = b + 64 + 16 * n + l0 // 2
    s = 8 * n + 2 * g + l0 // 16
    sc = i32(u32(words[b + 96 + s // 2]) << u32(24 - 8 * (s % 2))) >> 24
    dl = half16(words, b + 104) * f32(sc)
    out = pk.local_array(u32, 4)
    for h in pk.static_range(2):
        low = (pair16(words, ql + 2 * h) >> u32(4 * (g // 2))) & u32(0x0F0F0F0F)
        high = (pair16(words, qh + 2 * h) >> u32(2 * g)) & u32(0x03030303)
        quants = low | (high << u32(4))                 # 4 bytes of q, 0..63
        for i in pk.static_range(2):
            lo = dl * (byte_f32(quants, 2 * i) - (TWO_23 + 32.0))
            up = dl * (byte_f32(quants, 2 * i + 1) - (TWO_23 + 32.0))
            out[2 * h + i] = pk.pack_f16x2(lo, up)
    return out[0], out[1], out[2], out[3]


@pk.func
def dequant_chunk(words, wrow: i32, v: i32, FMT: Const[int]):
    """Values v..v+7 of the raw row at word wrow as 4 f16 pairs (module docstring); words:
    u16 for Q8_0 / Q6_K, u32 for Q4_K, decode8's word type for the rest."""
    if FMT == Q8_0:
        return q8_0_chunk(words, wrow, v)
    elif FMT == Q4_K:
        return q4k_chunk(words, wrow, v)
    elif FMT == Q6_K:
        return q6k_chunk(words, wrow, v)
    v0, v1, v2, v3, v4, v5, v6, v7 = decode8(FMT, words, wrow, v)
    return (pk.pack_f16x2(v0, v1), pk.pack_f16x2(v2, v3), pk.pack_f16x2(v4, v5),
            pk.pack_f16x2(v6, v7))
