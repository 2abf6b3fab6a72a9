"""Decode eight consecutive weights of a GGUF row to float32 (device functions).

`decode8(FMT, w, wrow, k) -> 8 x f32`: elements k..k+7 (k % 8 == 0) of the row that starts at
word `wrow` of `w`. Used by the f32-activation GEMV and the f16 tensor-core GEMM tile loader.
Words are u32 for the 4-byte-aligned formats (F32, Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) and u16 for
the rest (F16, BF16, Q4_0, Q5_0, Q8_0, Q3_K, Q6_K, Q1_0); layouts are in formats.py. Values
equal reference.dequantize in f32 (same products; ggml's CUDA dequantizers use these too).
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, bf16, f16, f32, i32, u16, u32

from .dot_q8 import half16, pair16
from .formats import F16, F32, Q4_0, Q4_1, Q5_0, Q8_0
# F16 / BF16 rows read as u32 words (rows of a multiple of 8 halves in a 16-byte aligned
# buffer): one 16-byte load per 8 values instead of 8 u16 loads. Not ggml ids: ours.
F16_WORDS, BF16_WORDS = 1001, 1030


@pk.func
def byte_of(word: u32, k: i32) -> u32:
    return (word >> u32(8 * k)) & u32(0xFF)


@pk.func
def byte3(s0: u32, s1: u32, s2: u32, k: i32) -> u32:
    """Byte k (0..11) of three little-endian words."""
    word = s0 if k < 4 else (s1 if k < 8 else s2)
    return byte_of(word, k % 4)


@pk.func
def scale_min_k4(s0: u32, s1: u32, s2: u32, j: i32):
    """ggml's get_scale_min_k4: 6-bit (scale, min) of sub-block j from the 12 scale bytes."""
    if j < 4:
        return f32(byte3(s0, s1, s2, j) & u32(63)), f32(byte3(s0, s1, s2, j + 4) & u32(63))
    sc = (byte3(s0, s1, s2, j + 4) & u32(15)) | ((byte3(s0, s1, s2, j - 4) >> u32(6)) << u32(4))
    m = (byte3(s0, s1, s2, j + 4) >> u32(4)) | ((byte3(s0, s1, s2, j) >> u32(6)) << u32(4))
    return f32(sc), f32(m)


@pk.func
def q8_values(lo: u32, hi: u32, scale: f32):
    """Eight signed bytes (lo then hi word) times scale."""
    out = pk.local_array(f32, 8)
    for t in pk.static_range(8):
        word = lo if t < 4 else hi
        out[t] = scale * f32(i32(word << u32(24 - 8 * (t % 4))) >> 24)
    return out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7]


@pk.func
def affine_values(lo: u32, hi: u32, shift: u32, mask: u32, top: u32, topshift: u32, off: i32,
                  d: f32, m: f32):
    """Eight values d * (q - off) + m, q = ((byte >> shift) & mask) | (bit t of top >> topshift)
    << 4 (the same float operations as ggml's dequantizers)."""
    out = pk.local_array(f32, 8)
    for t in pk.static_range(8):
        word = lo if t < 4 else hi
        q = ((word >> u32(8 * (t % 4))) >> shift) & mask
        q = q | (((top >> topshift) >> u32(t)) & u32(1)) << u32(4)
        out[t] = d * f32(i32(q) - off) + m
    return out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7]


@pk.func
def decode8_plain(FMT: Const[int], w: Ptr[u32, "ro"], wrow: i32, k: i32):
    out = pk.local_array(f32, 8)
    if FMT == F32:
        for h in pk.static_range(2):
            a, b, c, d = pk.load_vec(w, wrow + k + 4 * h, 4)
            out[4 * h] = pk.bitcast(a, f32)
            out[4 * h + 1] = pk.bitcast(b, f32)
            out[4 * h + 2] = pk.bitcast(c, f32)
            out[4 * h + 3] = pk.bitcast(d, f32)
    else:
        for t in pk.static_range(8):
            if FMT == F16:
                out[t] = f32(pk.bitcast(w[wrow + k + t], f16))
            else:
                out[t] = f32(pk.bitcast(w[wrow + k + t], bf16))
    return out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7]


@pk.func
def decode8_halves(FMT: Const[int], w: Ptr[u32, "ro"], wrow: i32, k: i32):
    """F16_WORDS / BF16_WORDS: halves k..k+7 of the row at u32 word wrow, one 16-byte load."""
    out = pk.local_array(f32, 8)
    words = pk.load_vec(w, wrow + k // 2, 4)
    for t in pk.static_range(4):
        if FMT == F16_WORDS:
            lo, hi = pk.unpack_f16x2(words[t])
            out[2 * t] = lo
            out[2 * t + 1] = hi
        else:
            out[2 * t] = pk.bitcast(words[t] << u32(16), f32)
            out[2 * t + 1] = pk.bitcast(words[t] & u32(0xFFFF0000), f32)
    return out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7]


@pk.func
def decode8_legacy(FMT: Const[int], w: Ptr[u16, "ro"], wrow: i32, k: i32):
    """Q4_0 (9 u16), Q5_0 (11 u16), Q8_0 (17 u16) blocks of 32; Q1_0 (9 u16) of 128."""
    o = k % 32
    j0 = o % 16
    shift = u32(4 * (o // 16))
    if FMT == Q4_0:
        b = wrow + 9 * (k // 32)
        return affine_values(pair16(w, b + 1 + j0 // 2), pair16(w, b + 3 + j0 // 2), shift,
                             u32(15), u32(0), u32(0), 8, half16(w, b), 0.0)
    if FMT == Q5_0:
        b = wrow + 11 * (k // 32)
        d = half16(w, b)
        return affine_values(pair16(w, b + 3 + j0 // 2), pair16(w, b + 5 + j0 // 2), shift,
                             u32(15), pair16(w, b + 1), u32(o), 16, d, 0.0)
    if FMT == Q8_0:
        b = wrow + 17 * (k // 32)
        return q8_values(pair16(w, b + 1 + o // 2), pair16(w, b + 3 + o // 2), half16(w, b))
    b = wrow + 9 * (k // 128)  # Q1_0: bit j of the 16 bytes set means +d
    d = half16(w, b)
    bits = (u32(w[b + 1 + (k % 128) // 16]) >> u32(8 * ((k // 8) % 2))) & u32(0xFF)
    out = pk.local_array(f32, 8)
    for t in pk.static_range(8):
        out[t] = d if (bits >> u32(t)) & u32(1) != u32(0) else -d
    return out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7]


@pk.func
def decode8_legacy_aligned(FMT: Const[int], w: Ptr[u32, "ro"], wrow: i32, k: i32):
    """Q4_1 (5 u32) and Q5_1 (6 u32) blocks of 32: q * d + m."""
    o = k % 32
    shift = u32(4 * (o // 16))
    j0 = o % 16
    if FMT == Q4_1:
        b = wrow + 5 * (k // 32)
        d, m = pk.unpack_f16x2(w[b])
        return affine_values(w[b + 1 + j0 // 4], w[b + 2 + j0 // 4], shift, u32(15), u32(0),
                             u32(0), 0, d, m)
    b = wrow + 6 * (k // 32)
    d, m = pk.unpack_f16x2(w[b])
    return affine_values(w[b + 2 + j0 // 4], w[b + 3 + j0 // 4], shift, u32(15), w[b + 1],
                         u32(o), 0, d, m)
