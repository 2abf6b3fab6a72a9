"""MXFP4 inside kernels (@pk.func, inlined): element decode, 8-value decode and the DP4A dot
with Q8_1 activations.

MXFP4 block (17 B / 32 values): e:u8 (e8m0) | qs:16 B; value j = KVALUES[code_j] * 2^(e-128),
code_j the low nibble of qs[j] for j < 16, the high nibble of qs[j - 16] otherwise; KVALUES are
the e2m1 values doubled (small integers: an int8 dot with the activations is exact, as for
Q8_0). Blocks are 17 bytes, so rows are read as bytes (`w: Ptr[u8]`, `wrow` a byte offset), or,
in buffers of a multiple of 4 bytes, as aligned u32 words around the block (dot_q8_MXFP4_words).
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u8, u32

from .dot_q8 import act, act_scale, funnel16

BLOCK_BYTES = 17
# the 16 KVALUES as four little-endian words of int8: codes 0-3, 4-7, 8-11, 12-15
KV_POS_LO, KV_POS_HI = 0x03020100, 0x0C080604
KV_NEG_LO, KV_NEG_HI = 0xFDFEFF00, 0xF4F8FAFC


@pk.func
def e8m0_half(e: u32) -> f32:
    """2^(e - 128) exactly (ggml's e8m0_to_fp32_half: e < 2 is an f32 subnormal)."""
    bits = (u32(0x00200000) << e) if e < u32(2) else ((e - u32(1)) << u32(23))
    return pk.bitcast(bits, f32)


@pk.func
def kvalue(code: u32) -> f32:
    """KVALUES[code] (code 0..15) as f32."""
    word = KV_POS_LO if code < u32(4) else (KV_POS_HI if code < u32(8) else (
        KV_NEG_LO if code < u32(12) else KV_NEG_HI))
    return f32(pk.bitcast(u32(word) << (u32(24) - u32(8) * (code % u32(4))), i32) >> 24)


@pk.func
def mxfp4_element(b: Ptr[u8, "ro"], j: i32) -> f32:
    """Value j (0..31) of the block at b."""
    byte = u32(b[1 + j % 16])
    code = (byte >> u32(4 * (j // 16))) & u32(15)
    return kvalue(code) * e8m0_half(u32(b[0]))


@pk.func
def decode8_mxfp4(w: Ptr[u8, "ro"], wrow: i32, k: i32):
    """Values k..k+7 (k % 8 == 0) of the row at byte wrow, as 8 f32."""
    b = wrow + BLOCK_BYTES * (k // 32)
    o = k % 32
    shift = u32(4 * (o // 16))
    scale = e8m0_half(u32(w[b]))
    out = pk.local_array(f32, 8)
    for t in pk.static_range(8):
        code = (u32(w[b + 1 + o % 16 + t]) >> shift) & u32(15)
        out[t] = kvalue(code) * scale
    return out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7]


@pk.func
def bytes4(w: Ptr[u8, "ro"], i: i32) -> u32:
    return u32(w[i]) | (u32(w[i + 1]) << u32(8)) | (u32(w[i + 2]) << u32(16)) | \
        (u32(w[i + 3]) << u32(24))


@pk.func
def codes_to_int8(codes: u32) -> i32:
    """Four codes (one per byte, 0..15) -> their four KVALUES as packed int8 (two table
    lookups by byte permutes, then a per-byte choice by the sign bit)."""
    m = codes & u32(0x07070707)
    packed = m | (m >> u32(4))
    sel = (packed & u32(0xFF)) | ((packed >> u32(8)) & u32(0xFF00))
    pos = pk.prmt(u32(KV_POS_LO), u32(KV_POS_HI), sel)
    neg = pk.prmt(u32(KV_NEG_LO), u32(KV_NEG_HI), sel)
    negative = ((codes >> u32(3)) & u32(0x01010101)) * u32(0xFF)
    return pk.bitcast((pos & ~negative) | (neg & negative), i32)


@pk.func
def dot_codes_q8(lo: Ptr[i32], hi: Ptr[i32], scale: f32, blk: i32, xq: Ptr[u32, "ro"],
                 xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    """acc[a0 + bt] += scale . (one block's 32 values as int8: lo = values 0..15, hi =
    16..31, four per word) . token bt's Q8_1 block blk, for each of BATCH tokens."""
    for bt in pk.static_range(BATCH):
        x = bt * xstride + 9 * blk
        s = i32(0)
        for k in pk.static_range(4):
            s = pk.dp4a(lo[k], act(xq, x + 1 + k), s)
            s = pk.dp4a(hi[k], act(xq, x + 5 + k), s)
        dx, sx = act_scale(xq, x)
        acc[a0 + bt] += (scale * dx) * f32(s)


@pk.func
def dot_q8_MXFP4(w: Ptr[u8, "ro"], wrow: i32, blk: i32, part: i32, xq: Ptr[u32, "ro"],
                 xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    """acc[a0 + bt] += block blk of the row at byte wrow . token bt's Q8_1 block (the
    item_dot_q8 contract of gemv_kernels.py; one item per block)."""
    b = wrow + BLOCK_BYTES * blk
    scale = e8m0_half(u32(w[b]))
    lo = pk.local_array(i32, 4)
    hi = pk.local_array(i32, 4)
    for k in pk.static_range(4):
        v = bytes4(w, b + 1 + 4 * k)
        lo[k] = codes_to_int8(v & u32(0x0F0F0F0F))
        hi[k] = codes_to_int8((v >> u32(4)) & u32(0x0F0F0F0F))
    dot_codes_q8(lo, hi, scale, blk, xq, xstride, acc, a0, BATCH)


@pk.func
def dot_q8_MXFP4_words(w: Ptr[u32, "ro"], wrow: i32, blk: i32, part: i32, xq: Ptr[u32, "ro"],
                       xstride: i32, acc: Ptr[f32], a0: i32, BATCH: Const[int]):
    """dot_q8_MXFP4 with the weights read as u32 words: five aligned word loads cover the
    17-byte block (its start is any byte), instead of 17 byte loads. wrow is still the row's
    byte offset. The last word can end up to 3 bytes past the block, so the caller's buffer
    must hold a multiple of 4 bytes (then the buffer's last block ends on a word boundary)."""
    b = wrow + BLOCK_BYTES * blk
    o = b % 4
    raw = pk.local_array(u32, 5)
    for k in pk.static_range(5):
        raw[k] = w[b // 4 + k]
    scale = e8m0_half((raw[0] >> u32(8 * o)) & u32(0xFF))
    shift = u32(8 * (o + 1))        # qs start one byte after e: 8..32 bits into raw[0]
    lo = pk.local_array(i32, 4)
    hi = pk.local_array(i32, 4)
    for k in pk.static_range(4):
        v = funnel16(raw[k], raw[k + 1], shift)
        lo[k] = codes_to_int8(v & u32(0x0F0F0F0F))
        hi[k] = codes_to_int8((v >> u32(4)) & u32(0x0F0F0F0F))
    dot_codes_q8(lo, hi, scale, blk, xq, xstride, acc, a0, BATCH)
