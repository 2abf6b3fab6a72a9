"""GPU quantize kernels for the 32/128-element formats and the float formats, plus the float32
building blocks (ggml's rounding functions) shared with the K-quant kernels.

Input: `x` rows of f32, f16 or bf16 (bf16 passed as its raw uint16 bits, `BF16=True`), flattened
to blocks back to back. Output: `out` uint8 block bytes back to back (layouts in formats.py).
One thread per block: a 32-element block is small enough to keep in registers and ggml's loops
are sequential per block, so a thread reproduces them in C's exact float32 order (no FMA: the
compiler emits mul.rn/add.rn, which ptxas never contracts).
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f16, f32, i32, u8, u32
from pykernel.intrinsics.mathfns import trunc

from .formats import F16, F32, Q4_0, Q4_1, Q5_0, Q5_1

GROUP_MAX_EPS = 1e-15  # ggml: a group whose largest |x| is below this counts as all zero


@pk.func
def load_x(x, i: i32, BF16: Const[bool]) -> f32:
    """Element i of the input as float32 (exact for f32, f16 and bf16 bits)."""
    if BF16:
        return pk.bitcast(u32(x[i]) << 16, f32)
    return f32(x[i])


@pk.func
def nearest_int(v: f32) -> i32:
    """ggml's nearest_int: round half to even via the 1.5*2^23 trick (same garbage when huge).

    A NaN (inf*0 after an f16 scale overflowed) gives 0, as x86's default NaN does in ggml's C
    code; the GPU's canonical NaN has other mantissa bits and would give 0x3FFFFF.
    """
    if v != v:
        return 0
    return (pk.bitcast(v + 12582912.0, i32) & 0x7FFFFF) - 0x400000


@pk.func
def clamp(v: i32, lo: i32, hi: i32) -> i32:
    return lo if v < lo else (hi if v > hi else v)


@pk.func
def roundf(v: f32) -> f32:
    """C roundf (half away from zero); floor(2*frac) avoids the |v|+0.5 double rounding."""
    a = abs(v)
    whole = pk.floor(a)
    r = whole + pk.floor(2.0 * (a - whole))
    return -r if v < 0.0 else r


@pk.func
def half_bits(v: f32) -> u32:
    """GGML_FP32_TO_FP16 bits (round to nearest even) in the low 16 bits."""
    return pk.pack_f16x2(v, 0.0) & u32(0xFFFF)


@pk.func
def f16_round(v: f32) -> f32:
    """The float32 value of the f16 that v is stored as."""
    return f32(f16(v))


@pk.func
def put_half(out: Ptr[u8], o: i32, v: f32):
    bits = half_bits(v)
    out[o] = u8(bits & u32(255))
    out[o + 1] = u8(bits >> 8)


@pk.func
def symmetric_scale(xs, N: Const[int]) -> f32:
    """Signed value of the first element of largest magnitude (C: `if (amax < fabsf(v))`)."""
    amax = f32(0.0)
    vmax = f32(0.0)
    for j in pk.static_range(N):
        if amax < abs(xs[j]):
            amax = abs(xs[j])
            vmax = xs[j]
    return vmax


@pk.func
def min_max(xs, N: Const[int]):
    """C's `min = FLT_MAX; max = -FLT_MAX; if (v < min) ...; if (v > max) ...` (first wins)."""
    lo = f32(3.4028234663852886e38)
    hi = f32(-3.4028234663852886e38)
    for j in pk.static_range(N):
        if xs[j] < lo:
            lo = xs[j]
        if xs[j] > hi:
            hi = xs[j]
    return lo, hi


@pk.func
def quantize_q4_0_q5_0(xs, out: Ptr[u8], o: i32, FIVE: Const[bool]):
    # Q4_0 (18 B): d | qs[16]. Q5_0 (22 B): d | qh:u32 | qs[16]; q = MIN(top, (int8)(x*id + half))
    top = 31 if FIVE else 15
    d = symmetric_scale(xs, 32) / f32(-(top + 1) // 2)
    inv = 1.0 / d if d != 0.0 else f32(0.0)
    put_half(out, o, d)
    qh = u32(0)
    qs = o + (6 if FIVE else 2)
    for j in pk.static_range(16):
        lo = min(top, i32(trunc(xs[j] * inv + (16.5 if FIVE else 8.5))))
        hi = min(top, i32(trunc(xs[j + 16] * inv + (16.5 if FIVE else 8.5))))
        out[qs + j] = u8((lo & 15) | ((hi & 15) << 4))
        qh = qh | (u32((lo >> 4) & 1) << u32(j)) | (u32((hi >> 4) & 1) << u32(j + 16))
    if FIVE:
        for k in pk.static_range(4):
            out[o + 2 + k] = u8((qh >> u32(8 * k)) & u32(255))


@pk.func
def quantize_q4_1_q5_1(xs, out: Ptr[u8], o: i32, FIVE: Const[bool]):
    # Q4_1 (20 B): d | m | qs[16]. Q5_1 (24 B): d | m | qh:u32 | qs[16]; q = (x - min)*id + 0.5
    top = 31 if FIVE else 15
    lo, hi = min_max(xs, 32)
    d = (hi - lo) / f32(top)
    inv = 1.0 / d if d != 0.0 else f32(0.0)
    put_half(out, o, d)
    put_half(out, o + 2, lo)
    qh = u32(0)
    qs = o + (8 if FIVE else 4)
    for j in pk.static_range(16):
        a = min(top, i32(trunc((xs[j] - lo) * inv + 0.5)))
        b = min(top, i32(trunc((xs[j + 16] - lo) * inv + 0.5)))
        out[qs + j] = u8((a & 15) | ((b & 15) << 4))
        qh = qh | (u32((a >> 4) & 1) << u32(j)) | (u32((b >> 4) & 1) << u32(j + 16))
    if FIVE:
        for k in pk.static_range(4):
            out[o + 4 + k] = u8((qh >> u32(8 * k)) & u32(255))


@pk.func
def quantize_q8_0(xs, out: Ptr[u8], o: i32):
    # Q8_0 (34 B): d | qs:i8[32]; d = amax/127, q = roundf(x/d)
    amax = f32(0.0)
    for j in pk.static_range(32):
        if abs(xs[j]) > amax:
            amax = abs(xs[j])
    d = amax / 127.0
    inv = 1.0 / d if d != 0.0 else f32(0.0)
    put_half(out, o, d)
    for j in pk.static_range(32):
        out[o + 2 + j] = u8(i32(roundf(xs[j] * inv)) & 255)


@pk.kernel
def quantize_blocks32(x: Ptr["T", "ro"], out: Ptr[u8], n_blocks: i32, FMT: Const[int],
                      BLOCK_BYTES: Const[int], BF16: Const[bool], T: Const[pk.dtype]):
    """One 32-element block per thread; FMT: the ggml id of Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0."""
    b = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if b < n_blocks:
        xs = pk.local_array(f32, 32)
        for j in pk.static_range(32):
            xs[j] = load_x(x, 32 * b + j, BF16)
        o = b * BLOCK_BYTES
        if FMT == Q4_0:
            quantize_q4_0_q5_0(xs, out, o, False)
        elif FMT == Q5_0:
            quantize_q4_0_q5_0(xs, out, o, True)
        elif FMT == Q4_1:
            quantize_q4_1_q5_1(xs, out, o, False)
        elif FMT == Q5_1:
            quantize_q4_1_q5_1(xs, out, o, True)
        else:  # Q8_0
            quantize_q8_0(xs, out, o)


@pk.kernel
def quantize_q1_0(x: Ptr["T", "ro"], out: Ptr[u8], n_blocks: i32, BF16: Const[bool],
                  T: Const[pk.dtype]):
    """Q1_0 (18 B per 128): d = fp16(sum|x| / 128) summed in order; bit j set when x[j] >= 0."""
    b = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if b < n_blocks:
        total = abs(load_x(x, 128 * b, BF16))
        for j in range(1, 128):
            total += abs(load_x(x, 128 * b + j, BF16))
        put_half(out, 18 * b, total / 128.0)
        for k in range(16):
            bits = 0
            for j in pk.static_range(8):
                if load_x(x, 128 * b + 8 * k + j, BF16) >= 0.0:
                    bits = bits | (1 << j)
            out[18 * b + 2 + k] = u8(bits)


@pk.kernel
def convert_floats(x: Ptr["T", "ro"], out: Ptr[u8], n: i32, FMT: Const[int], BF16: Const[bool],
                   T: Const[pk.dtype]):
    """Element-wise F32 / F16 / BF16 storage (FMT: the ggml id) as little-endian bytes."""
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        v = load_x(x, i, BF16)
        if FMT == F32:
            bits = pk.bitcast(v, u32)
            for k in pk.static_range(4):
                out[4 * i + k] = u8((bits >> u32(8 * k)) & u32(255))
        elif FMT == F16:
            put_half(out, 2 * i, v)
        else:  # BF16
            bits = pk.bitcast(v, u32)
            if (bits & u32(0x7FFFFFFF)) > u32(0x7F800000):
                bits = (bits & u32(0xFFFF0000)) | u32(64 << 16)   # quiet the NaN
            else:
                bits = bits + u32(0x7FFF) + ((bits >> u32(16)) & u32(1))
            out[2 * i] = u8((bits >> u32(16)) & u32(255))
            out[2 * i + 1] = u8(bits >> u32(24))
