"""GPU dequantize kernels: GGUF block rows -> float32 or float16 rows, bit-exact with ggml.

Input: `raw` uint8 (rows, row_bytes) holding whole blocks (layouts in formats.py).
Output: `out` (rows, n) of f32 or f16 (f16 = the f32 value rounded to nearest even).
`dequantize_rows8`: each thread decodes 8 consecutive elements of one block (the block header
loaded once, 16-byte stores); used whenever rows are whole multiples of 8 elements, i.e. for
every quantized format. `dequantize_rows`: one thread per element (float rows of any length).
Neighbouring threads share their block's bytes through the L1 cache. Products follow ggml's
dequantize_row_* order, e.g. Q4_K is `(d*sc)*q - (dmin*m)` in float32, so the results match
ggml's bits.
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u8, u32

from .formats import (DEQUANT, F16, F32, MXFP4, Q1_0, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0,
                      Q5_1, Q5_K, Q6_K, Q8_0, type_ids)
from .mxfp4 import mxfp4_element

# type name -> the `FMT` Const of the kernels: its ggml id (formats.py)
CODES = type_ids(DEQUANT)


@pk.func
def load_half(p: Ptr[u8, "ro"], i: i32) -> f32:
    """The f16 stored little-endian at p[i], p[i+1], as float32 (exact)."""
    value, unused = pk.unpack_f16x2(u32(p[i]) | (u32(p[i + 1]) << 8))
    return value


@pk.func
def load_u32(p: Ptr[u8, "ro"], i: i32) -> u32:
    """Little-endian u32 at any byte offset (Q5_0/Q5_1 put qh at offset 2 or 4)."""
    return u32(p[i]) | (u32(p[i + 1]) << 8) | (u32(p[i + 2]) << 16) | (u32(p[i + 3]) << 24)


@pk.func
def signed_byte(b: u8) -> i32:
    v = i32(b)
    return v - 256 if v > 127 else v


@pk.func
def nibble_32(qs: Ptr[u8, "ro"], j: i32) -> i32:
    """Element j of a 32-block packed as: low nibbles = elements 0..15, high = 16..31."""
    return i32(qs[j] & 15) if j < 16 else i32(qs[j - 16] >> 4)


@pk.func
def deq_q4_0(b: Ptr[u8, "ro"], j: i32) -> f32:
    # Q4_0 (18 B): d:f16 | qs:16 B
    return f32(nibble_32(b + 2, j) - 8) * load_half(b, 0)


@pk.func
def deq_q4_1(b: Ptr[u8, "ro"], j: i32) -> f32:
    # Q4_1 (20 B): d:f16 | m:f16 | qs:16 B
    return f32(nibble_32(b + 4, j)) * load_half(b, 0) + load_half(b, 2)


@pk.func
def fifth_bit(qh: u32, j: i32) -> i32:
    return i32((qh >> u32(j)) & u32(1)) << 4


@pk.func
def deq_q5_0(b: Ptr[u8, "ro"], j: i32) -> f32:
    # Q5_0 (22 B): d:f16 | qh:u32 | qs:16 B
    q = nibble_32(b + 6, j) | fifth_bit(load_u32(b, 2), j)
    return f32(q - 16) * load_half(b, 0)


@pk.func
def deq_q5_1(b: Ptr[u8, "ro"], j: i32) -> f32:
    # Q5_1 (24 B): d:f16 | m:f16 | qh:u32 | qs:16 B
    q = nibble_32(b + 8, j) | fifth_bit(load_u32(b, 4), j)
    return f32(q) * load_half(b, 0) + load_half(b, 2)


@pk.func
def deq_q8_0(b: Ptr[u8, "ro"], j: i32) -> f32:
    # Q8_0 (34 B): d:f16 | qs:i8[32]
    return f32(signed_byte(b[2 + j])) * load_half(b, 0)


@pk.func
def deq_q2_k(b: Ptr[u8, "ro"], j: i32) -> f32:
    # Q2_K (84 B): scales[16] | qs[64] | d:f16 | dmin:f16; sub-block j/16
    half = j // 128
    shift = ((j % 128) // 32) * 2
    q = i32((b[16 + 32 * half + j % 32] >> u8(shift)) & 3)
    sc = b[j // 16]
    dl = load_half(b, 80) * f32(i32(sc & 15))
    ml = load_half(b, 82) * f32(i32(sc >> 4))
    return dl * f32(q) - ml


@pk.func
def q3_k_scale(scales: Ptr[u8, "ro"], s: i32) -> i32:
    """Six-bit scale s of Q3_K's 12 scale bytes, minus 32."""
    low = i32(scales[s] & 15) if s < 8 else i32(scales[s - 8] >> 4)
    high = (i32(scales[8 + s % 4]) >> (2 * (s // 4))) & 3
    return (low | (high << 4)) - 32


@pk.func
def deq_q3_k(b: Ptr[u8, "ro"], j: i32) -> f32:
    # Q3_K (110 B): hmask[32] | qs[64] | scales[12] | d:f16
    half = j // 128
    group = (j % 128) // 32
    l = j % 32
    low = i32((b[32 + 32 * half + l] >> u8(2 * group)) & 3)
    high_set = (i32(b[l]) >> (4 * half + group)) & 1
    q = low - (0 if high_set != 0 else 4)
    dl = load_half(b, 108) * f32(q3_k_scale(b + 96, j // 16))
    return dl * f32(q)


@pk.func
def scale_min_k4(q: Ptr[u8, "ro"], s: i32):
    """get_scale_min_k4: (scale, min) of sub-block s from Q4_K/Q5_K's 12 scale bytes."""
    if s < 4:
        return i32(q[s] & 63), i32(q[s + 4] & 63)
    sc = i32(q[s + 4] & 15) | (i32(q[s - 4] >> 6) << 4)
    mn = i32(q[s + 4] >> 4) | (i32(q[s] >> 6) << 4)
    return sc, mn


@pk.func
def deq_k4(b: Ptr[u8, "ro"], j: i32, QS: Const[int], FIVE: Const[bool]) -> f32:
    # Q4_K (144 B): d | dmin | scales[12] | qs[128] at 16
    # Q5_K (176 B): d | dmin | scales[12] | qh[32] at 16 | qs[128] at 48
    chunk = j // 64
    l = j % 32
    sub = j // 32
    byte = b[QS + 32 * chunk + l]
    q = i32(byte & 15) if (j % 64) < 32 else i32(byte >> 4)
    if FIVE:
        q = q | ((i32(b[16 + l]) >> sub) & 1) << 4
    sc, mn = scale_min_k4(b + 4, sub)
    d1 = load_half(b, 0) * f32(sc)
    m1 = load_half(b, 2) * f32(mn)
    return d1 * f32(q) - m1


@pk.func
def deq_q6_k(b: Ptr[u8, "ro"], j: i32) -> f32:
    # Q6_K (210 B): ql[128] | qh[64] | scales:i8[16] | d:f16
    half = j // 128
    group = (j % 128) // 32
    l = j % 32
    low_byte = b[64 * half + 32 * (group % 2) + l]
    low = i32(low_byte & 15) if group < 2 else i32(low_byte >> 4)
    high = (i32(b[128 + 32 * half + l]) >> (2 * group)) & 3
    q = (low | (high << 4)) - 32
    sc = signed_byte(b[192 + j // 16])
    return load_half(b, 208) * f32(sc) * f32(q)


@pk.func
def deq_q1_0(b: Ptr[u8, "ro"], j: i32) -> f32:
    # Q1_0 (18 B): d:f16 | 128 sign bits
    d = load_half(b, 0)
    return d if ((i32(b[2 + j // 8]) >> (j % 8)) & 1) != 0 else -d


@pk.func
def deq_float(b: Ptr[u8, "ro"], FMT: Const[int]) -> f32:
    if FMT == F32:
        return pk.bitcast(load_u32(b, 0), f32)
    if FMT == F16:
        return load_half(b, 0)
    return pk.bitcast((u32(b[0]) << 16) | (u32(b[1]) << 24), f32)  # BF16


@pk.func
def dequantize_one(b: Ptr[u8, "ro"], j: i32, FMT: Const[int]) -> f32:
    """Element j of the block at b (FMT: its ggml id, formats.py)."""
    if FMT == Q4_0:
        return deq_q4_0(b, j)
    if FMT == Q4_1:
        return deq_q4_1(b, j)
    if FMT == Q5_0:
        return deq_q5_0(b, j)
    if FMT == Q5_1:
        return deq_q5_1(b, j)
    if FMT == Q8_0:
        return deq_q8_0(b, j)
    if FMT == Q2_K:
        return deq_q2_k(b, j)
    if FMT == Q3_K:
        return deq_q3_k(b, j)
    if FMT == Q4_K:
        return deq_k4(b, j, 16, False)
    if FMT == Q5_K:
        return deq_k4(b, j, 48, True)
    if FMT == Q6_K:
        return deq_q6_k(b, j)
    if FMT == Q1_0:
        return deq_q1_0(b, j)
    if FMT == MXFP4:   # MXFP4 (17 B): e:u8 | qs:16 B
        return mxfp4_element(b, j)
    return deq_float(b, FMT)


@pk.kernel
def dequantize_rows(raw: Ptr[u8, "ro"], out: Ptr["T"], total: i32, n: i32, row_bytes: i32,
                    FMT: Const[int], BLOCK_ELEMS: Const[int], BLOCK_BYTES: Const[int],
                    T: Const[pk.dtype]):
    """out[r, c] = element c of row r; total = rows * n elements, one per thread."""
    e = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if e < total:
        row = e // n
        col = e - row * n
        block = raw + row * row_bytes + (col // BLOCK_ELEMS) * BLOCK_BYTES
        out[e] = T(dequantize_one(block, col % BLOCK_ELEMS, FMT))


@pk.kernel
def dequantize_rows8(raw: Ptr[u8, "ro"], out: Ptr["T"], total: i32, n: i32, row_bytes: i32,
                     FMT: Const[int], BLOCK_ELEMS: Const[int], BLOCK_BYTES: Const[int],
                     T: Const[pk.dtype]):
    """Elements 8t .. 8t+7 per thread (n a multiple of 8; blocks hold a multiple of 8 or 1)."""
    e = (pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x) * 8
    if e < total:
        row = e // n
        col = e - row * n
        base = raw + row * row_bytes
        v = pk.local_array(f32, 8)
        for k in pk.static_range(8):
            if BLOCK_ELEMS == 1:
                v[k] = dequantize_one(base + (col + k) * BLOCK_BYTES, 0, FMT)
            else:
                v[k] = dequantize_one(base + (col // BLOCK_ELEMS) * BLOCK_BYTES,
                                      col % BLOCK_ELEMS + k, FMT)
        if T == f32:
            pk.store_vec(out, e, (v[0], v[1], v[2], v[3]))
            pk.store_vec(out, e + 4, (v[4], v[5], v[6], v[7]))
        else:
            pk.store_vec(out, e, (T(v[0]), T(v[1]), T(v[2]), T(v[3]), T(v[4]), T(v[5]),
                                  T(v[6]), T(v[7])))
