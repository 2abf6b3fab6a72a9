"""Decoding of GGUF quantized blocks inside kernels (@pk.func, inlined): one element at a time
from a row of blocks, plus the per-block helpers (f16 fields, Q4_K 6-bit scales) that grouped
decoders reuse.

Input: `row`, a Ptr[u8] to the first block of a row (blocks back to back, little-endian), and an
element index j within the row. Output: the dequantized f32 value. Layouts (REFERENCE.md s.1):
  Q4_0 (18 B / 32): d:f16 | qs[16]; x[k] = ((qs[k] & 15) - 8) * d, x[k+16] = ((qs[k] >> 4) - 8) * d
  Q4_1 (20 B / 32): d:f16 | m:f16 | qs[16]; same nibbles, x = q * d + m
  Q8_0 (34 B / 32): d:f16 | qs:i8[32]; x = q * d
  Q4_K (144 B / 256): d | dmin | scales[12] | qs[128]; chunk c of 64 uses qs[32c..32c+32], low
                      nibbles = sub-block 2c, high = 2c+1; x = d * sc * q - dmin * m
  Q6_K (210 B / 256): ql[128] | qh[64] | scales:i8[16] | d:f16; see q6_k_element
Reading is byte-wise (blocks are not 4-byte aligned: 18, 34, 210 bytes).
"""
import pykernel as pk
from pykernel import f16, f32, i8, i32, u16

from .quant.formats import EMBED, FORMATS, Q4_0, Q4_1, Q4_K, Q8_0, type_ids

TYPE_IDS = type_ids(EMBED)   # type name -> ggml id: the formats quant_element decodes
BLOCK_SHAPES = {i: (FORMATS[t].block_elems, FORMATS[t].block_bytes)
                for t, i in TYPE_IDS.items()}   # ggml id -> (elements, bytes) per block


@pk.func
def f16_at(p, i: i32) -> f32:
    """The little-endian f16 at byte offset i of p, as f32."""
    bits = u16(p[i]) | (u16(p[i + 1]) << 8)
    return f32(pk.bitcast(bits, f16))


@pk.func
def i8_at(p, i: i32) -> f32:
    return f32(pk.bitcast(p[i], i8))


@pk.func
def q4_k_scale_min(scales, j: i32):
    """(scale, min) of Q4_K/Q5_K sub-block j (0..7) from the 12 packed 6-bit scale bytes."""
    if j < 4:
        return f32(i32(scales[j]) & 63), f32(i32(scales[j + 4]) & 63)
    else:
        sc = (i32(scales[j + 4]) & 15) | ((i32(scales[j - 4]) >> 6) << 4)
        m = (i32(scales[j + 4]) >> 4) | ((i32(scales[j]) >> 6) << 4)
        return f32(sc), f32(m)


@pk.func
def q4_0_element(row, j: i32) -> f32:
    blk = row + (j // 32) * 18
    k = j % 32
    q = i32(blk[2 + k % 16]) >> (4 * (k // 16))
    return f32((q & 15) - 8) * f16_at(blk, 0)


@pk.func
def q4_1_element(row, j: i32) -> f32:
    blk = row + (j // 32) * 20
    k = j % 32
    q = i32(blk[4 + k % 16]) >> (4 * (k // 16))
    return f32(q & 15) * f16_at(blk, 0) + f16_at(blk, 2)


@pk.func
def q8_0_element(row, j: i32) -> f32:
    blk = row + (j // 32) * 34
    return i8_at(blk, 2 + j % 32) * f16_at(blk, 0)


@pk.func
def q4_k_element(row, j: i32) -> f32:
    blk = row + (j // 256) * 144
    k = j % 256
    chunk = k // 64
    high = (k % 64) // 32           # 0: low nibbles (sub-block 2c), 1: high (2c + 1)
    q = (i32(blk[16 + 32 * chunk + k % 32]) >> (4 * high)) & 15
    sc, m = q4_k_scale_min(blk + 4, 2 * chunk + high)
    return f16_at(blk, 0) * sc * f32(q) - f16_at(blk, 2) * m


@pk.func
def q6_k_element(row, j: i32) -> f32:
    # per 128-element half h: ql[64h..], qh[32h..], scales[8h..]; quarter g of the half takes
    # ql[l + 32 (g & 1)] nibble g >> 1, qh[l] bits 2g..2g+1, scale l / 16 + 2g
    blk = row + (j // 256) * 210
    k = j % 256
    h = k // 128
    g = (k % 128) // 32
    l = k % 32
    low = (i32(blk[64 * h + l + 32 * (g & 1)]) >> (4 * (g >> 1))) & 15
    high = (i32(blk[128 + 32 * h + l]) >> (2 * g)) & 3
    sc = i8_at(blk, 192 + 8 * h + l // 16 + 2 * g)
    return f16_at(blk, 208) * sc * f32((low | (high << 4)) - 32)


@pk.func
def quant_element(row, j: i32, QTYPE: pk.Const[int]) -> f32:
    """Element j of a row of QTYPE blocks (QTYPE a ggml type id known at compile time)."""
    if QTYPE == Q4_0:
        return q4_0_element(row, j)
    elif QTYPE == Q4_1:
        return q4_1_element(row, j)
    elif QTYPE == Q8_0:
        return q8_0_element(row, j)
    elif QTYPE == Q4_K:
        return q4_k_element(row, j)
    else:  # Q6_K
        return q6_k_element(row, j)
