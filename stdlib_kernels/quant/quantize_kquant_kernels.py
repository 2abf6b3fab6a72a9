"""GPU quantize kernel for the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), bit-exact with ggml.

Input: `x` float rows (f32, f16 or bf16 bits) as 256-element super-blocks back to back.
Output: `out` uint8, the super-blocks' bytes back to back (layouts in formats.py).

Work split: one thread per sub-block (16 per super-block for Q2_K/Q3_K/Q6_K, 8 for Q4_K/Q5_K),
so a super-block is an aligned group of lanes inside one warp:
1. each thread loads its sub-block into registers and runs ggml's scale search on it
   (quantize_search_kernels.py);
2. the group exchanges its scales with warp shuffles and every lane derives the super-block's
   scale(s) in C's order; each thread re-quantizes its own values with the f16-rounded scales;
3. levels, sub-scales and the f16 header go to shared memory; after one barrier the thread block
   writes its super-blocks' bytes cooperatively (consecutive threads, consecutive bytes).
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u8, u32

from .formats import Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
from .quantize_kernels import clamp, f16_round, half_bits, load_x, nearest_int
from .quantize_search_kernels import (affine_level, first_absmax, make_q3_quants,
                                      make_qkx2_quants, make_qx_quants)


@pk.func
def positive_max(vals, N: Const[int]) -> f32:
    """C's `m = 0; if (v > m) m = v;` over N values."""
    m = f32(0.0)
    for i in pk.static_range(N):
        if vals[i] > m:
            m = vals[i]
    return m


@pk.func
def gather(value: f32, dst, base: i32, N: Const[int]):
    """dst[s] = `value` of lane base+s, for the N lanes of this super-block (warp-collective)."""
    for s in pk.static_range(N):
        dst[s] = pk.shfl_idx(value, base + s)


@pk.func
def q6_k_sub(xs, lv, sc_sh, slot: i32, base: i32) -> u32:
    """Q6_K phase 1+2 for sub-block g: fills lv (levels 0..63), stores the i8 scale, returns
    the header (f16 bits of d)."""
    scale, iscale, zero = make_qx_quants(xs, 16, 32)
    scales = pk.local_array(f32, 16)
    gather(scale, scales, base, 16)
    amax, max_scale = first_absmax(scales, 16)
    live = amax >= 1e-15
    block_iscale = -128.0 / max_scale
    sc = min(127, nearest_int(block_iscale * scale))
    d = 1.0 / block_iscale
    sub_d = f16_round(d) * f32(sc)
    for i in pk.static_range(16):
        if not live:
            lv[i] = 0
        elif sub_d != 0.0:
            lv[i] = clamp(nearest_int(xs[i] / sub_d), -32, 31) + 32
        elif zero:
            lv[i] = 0
        else:
            lv[i] = clamp(nearest_int(iscale * xs[i]), -32, 31) + 32
    sc_sh[slot] = u8(sc & 255) if live else u8(0)
    return half_bits(d) if live else u32(0)


@pk.func
def qkx_sub(xs, lv, sc_sh, slot: i32, base: i32, FMT: Const[int], SUBS: Const[int],
            N: Const[int], NMAX: Const[int]) -> u32:
    """Q2_K, Q4_K, Q5_K (FMT: the ggml id) phase 1+2 for sub-block g: fills lv, stores the
    sub-block's scale byte(s), returns the header (d | dmin << 16 as f16 bits)."""
    ws = pk.local_array(f32, N)
    if FMT == Q2_K:
        for i in pk.static_range(N):
            ws[i] = abs(xs[i])
        scale, the_min, it, lo, flat = make_qkx2_quants(xs, ws, -0.5, N, NMAX, 15, True)
    else:
        sum_x2 = xs[0] * xs[0]
        for i in pk.static_range(1, N):
            sum_x2 += xs[i] * xs[i]
        av_x = pk.sqrt(sum_x2 / 32.0)
        for i in pk.static_range(N):
            ws[i] = av_x + abs(xs[i])
        scale, the_min, it, lo, flat = make_qkx2_quants(
            xs, ws, -1.0 if FMT == Q4_K else -0.5, N, NMAX, 20 if FMT == Q4_K else 15, False)
    group = pk.local_array(f32, SUBS)
    gather(scale, group, base, SUBS)
    max_scale = positive_max(group, SUBS)
    gather(the_min, group, base, SUBS)
    max_min = positive_max(group, SUBS)
    if FMT == Q2_K:
        inv_s = 15.0 / max_scale if max_scale > 0.0 else f32(0.0)
        inv_m = 15.0 / max_min if max_min > 0.0 else f32(0.0)
        ls = (nearest_int(inv_s * scale) & 255) if max_scale > 0.0 else 0
        lm = nearest_int(inv_m * the_min) if max_min > 0.0 else 0
        packed = (ls | (lm << 4)) & 255
        ls = packed & 15
        lm = packed >> 4
        d = max_scale / 15.0 if max_scale > 0.0 else f32(0.0)
        dmin = max_min / 15.0 if max_min > 0.0 else f32(0.0)
        sc_sh[slot] = u8(packed)
    else:
        inv_s = 63.0 / max_scale if max_scale > 0.0 else f32(0.0)
        inv_m = 63.0 / max_min if max_min > 0.0 else f32(0.0)
        ls = min(nearest_int(inv_s * scale) & 255, 63)
        lm = min(nearest_int(inv_m * the_min) & 255, 63)
        d = max_scale / 63.0
        dmin = max_min / 63.0
        sc_sh[slot] = u8(ls)
        sc_sh[slot + 8] = u8(lm)
    sub_d = f16_round(d) * f32(ls)
    sub_m = f16_round(dmin) * f32(lm)
    for i in pk.static_range(N):
        if sub_d != 0.0:
            lv[i] = clamp(nearest_int((xs[i] + sub_m) / sub_d), 0, NMAX)
        elif flat:
            lv[i] = 0
        else:
            lv[i] = i32(affine_level(xs[i], it, lo, NMAX))
    return half_bits(d) | (half_bits(dmin) << u32(16))


@pk.func
def q3_k_sub(xs, lv, sc_sh, slot: i32, base: i32) -> u32:
    """Q3_K phase 1+2 for sub-block g: fills lv (0..7), stores the 6-bit scale (biased by 32),
    returns the header (f16 bits of d)."""
    search = pk.local_array(f32, 16)
    scale = make_q3_quants(xs, search, 16, 4)
    scales = pk.local_array(f32, 16)
    gather(scale, scales, base, 16)
    amax, max_scale = first_absmax(scales, 16)
    has_scale = max_scale != 0.0
    iscale = -32.0 / max_scale
    q = ((nearest_int(iscale * scale) & 255) ^ 128) - 128      # C stores it in an int8_t
    q = clamp(q, -32, 31) + 32 if has_scale else 0
    d = 1.0 / iscale if has_scale else f32(0.0)
    sub_d = f16_round(d) * f32(q - 32) if has_scale else f32(0.0)
    for i in pk.static_range(16):
        if sub_d != 0.0:
            lv[i] = clamp(nearest_int(xs[i] / sub_d), -4, 3) + 4
        else:
            lv[i] = i32(search[i]) + 4
    sc_sh[slot] = u8(q)
    return half_bits(d)


@pk.func
def head_byte(head: u32, k: i32) -> u8:
    return u8((head >> u32(8 * k)) & u32(255))


@pk.func
def two_bit_byte(lv, e: i32, MASK: Const[int]) -> u8:
    """Byte of 4 two-bit levels: elements e, e+32, e+64, e+96 at bits 0, 2, 4, 6."""
    return u8((i32(lv[e]) & MASK) | ((i32(lv[e + 32]) & MASK) << 2)
              | ((i32(lv[e + 64]) & MASK) << 4) | ((i32(lv[e + 96]) & MASK) << 6))


@pk.func
def nibble_byte(lv, lo: i32, hi: i32) -> u8:
    return u8((i32(lv[lo]) & 15) | ((i32(lv[hi]) & 15) << 4))


@pk.func
def pack_q6_k(lv, sc, b: i32, s: i32, head: u32, o: i32) -> u8:
    # Q6_K (210 B): ql[128] | qh[64] | scales:i8[16] | d:f16
    if o < 128:
        e = b + 128 * (o // 64) + 32 * ((o % 64) // 32) + o % 32
        return nibble_byte(lv, e, e + 64)
    if o < 192:
        e = b + 128 * ((o - 128) // 32) + o % 32
        return u8((i32(lv[e]) >> 4) | ((i32(lv[e + 32]) >> 4) << 2)
                  | ((i32(lv[e + 64]) >> 4) << 4) | ((i32(lv[e + 96]) >> 4) << 6))
    if o < 208:
        return sc[s + o - 192]
    return head_byte(head, o - 208)


@pk.func
def k4_scale_byte(sc, s: i32, j: i32) -> u8:
    """Byte j of Q4_K/Q5_K's 12 scale bytes from 6-bit scales sc[s..s+8], mins sc[s+8..s+16]."""
    if j < 4:
        return u8(i32(sc[s + j]) | ((i32(sc[s + j + 4]) >> 4) << 6))
    if j < 8:
        return u8(i32(sc[s + j + 4]) | ((i32(sc[s + j + 8]) >> 4) << 6))
    return u8((i32(sc[s + j - 4]) & 15) | ((i32(sc[s + j + 4]) & 15) << 4))


@pk.func
def pack_k4(lv, sc, b: i32, s: i32, head: u32, o: i32, FIVE: Const[bool]) -> u8:
    # Q4_K (144 B): d | dmin | scales[12] | qs[128]
    # Q5_K (176 B): d | dmin | scales[12] | qh[32] | qs[128]
    qs = 48 if FIVE else 16
    if o < 4:
        return head_byte(head, o)
    if o < 16:
        return k4_scale_byte(sc, s, o - 4)
    if o < qs:
        l = o - 16
        bits = 0
        for sub in pk.static_range(8):
            bits = bits | (((i32(lv[b + 32 * sub + l]) >> 4) & 1) << sub)
        return u8(bits)
    r = o - qs
    e = b + 64 * (r // 32) + r % 32
    return nibble_byte(lv, e, e + 32)


@pk.func
def pack_q2_k(lv, sc, b: i32, s: i32, head: u32, o: i32) -> u8:
    # Q2_K (84 B): scales[16] | qs[64] | d | dmin
    if o < 16:
        return sc[s + o]
    if o < 80:
        return two_bit_byte(lv, b + 128 * ((o - 16) // 32) + (o - 16) % 32, 3)
    return head_byte(head, o - 80)


@pk.func
def pack_q3_k(lv, sc, b: i32, s: i32, head: u32, o: i32) -> u8:
    # Q3_K (110 B): hmask[32] | qs[64] | scales[12] | d
    if o < 32:
        bits = 0
        for k in pk.static_range(8):
            if i32(lv[b + 32 * k + o]) > 3:
                bits = bits | (1 << k)
        return u8(bits)
    if o < 96:
        return two_bit_byte(lv, b + 128 * ((o - 32) // 32) + o % 32, 3)
    if o < 104:
        j = o - 96
        return u8((i32(sc[s + j]) & 15) | ((i32(sc[s + j + 8]) & 15) << 4))
    if o < 108:
        j = o - 104
        bits = 0
        for a in pk.static_range(4):
            bits = bits | (((i32(sc[s + 4 * a + j]) >> 4) & 3) << (2 * a))
        return u8(bits)
    return head_byte(head, o - 108)


@pk.func
def pack_byte(lv, sc, b: i32, s: i32, head: u32, o: i32, FMT: Const[int]) -> u8:
    """Byte o of a super-block whose levels start at lv[b] and scale bytes at sc[s]."""
    if FMT == Q2_K:
        return pack_q2_k(lv, sc, b, s, head, o)
    if FMT == Q3_K:
        return pack_q3_k(lv, sc, b, s, head, o)
    if FMT == Q6_K:
        return pack_q6_k(lv, sc, b, s, head, o)
    return pack_k4(lv, sc, b, s, head, o, FMT == Q5_K)


@pk.kernel
def quantize_kquant(x: Ptr["T", "ro"], out: Ptr[u8], n_super: i32, FMT: Const[int],
                    SUBS: Const[int], N: Const[int], NMAX: Const[int], NT: Const[int],
                    SB: Const[int], BLOCK_BYTES: Const[int], BF16: Const[bool], T: Const[pk.dtype]):
    """NT threads = SB super-blocks x SUBS sub-blocks of N elements; levels 0..NMAX (Q2_K,
    Q4_K, Q5_K); FMT: the ggml id (formats.py)."""
    tid = pk.thread_idx.x
    local = tid // SUBS
    g = tid % SUBS
    sb = pk.block_idx.x * SB + local
    levels_sh = pk.shared_array(u8, SB * 256)
    scales_sh = pk.shared_array(u8, SB * 16)
    head_sh = pk.shared_array(u32, SB)
    xs = pk.local_array(f32, N)
    for i in pk.static_range(N):
        xs[i] = load_x(x, 256 * sb + N * g + i, BF16) if sb < n_super else f32(0.0)
    lv = pk.local_array(i32, N)
    base = pk.lane_id() - pk.lane_id() % SUBS
    if FMT == Q6_K:
        head = q6_k_sub(xs, lv, scales_sh, 16 * local + g, base)
    elif FMT == Q3_K:
        head = q3_k_sub(xs, lv, scales_sh, 16 * local + g, base)
    else:
        head = qkx_sub(xs, lv, scales_sh, 16 * local + g, base, FMT, SUBS, N, NMAX)
    for i in pk.static_range(N):
        levels_sh[256 * local + N * g + i] = u8(lv[i])
    if g == 0:
        head_sh[local] = head
    pk.syncthreads()
    first = pk.block_idx.x * SB
    count = min(SB, n_super - first)
    for k in range(tid, count * BLOCK_BYTES, NT):
        s = k // BLOCK_BYTES
        out[first * BLOCK_BYTES + k] = pack_byte(levels_sh, scales_sh, 256 * s, 16 * s,
                                                 head_sh[s], k % BLOCK_BYTES, FMT)
