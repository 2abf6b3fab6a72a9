"""The CPU target's forms of the Hopper intrinsics (intrinsics/wgmma.py): a wgmma computes when
issued, each thread its own accumulators (nothing is in flight, so fence / commit / wait have
no entry here and do nothing).

Accumulator i of thread (warp w of the warpgroup, lane 4g + t) is D[row][col] with
    row = 16 w + g + 8 ((i / 2) % 2),   col = 8 (i / 4) + 2 t + i % 2
and D[row][col] = sum over k of A[row][k] * B[col][k] (+ the old value when scale_d), the
products and sums in f32 in k order as the mma.sync emulation does (exact for the integer
kinds: i32 wrap-around). A K-major operand element (r, k) at byte kb = k * size is read from
shared memory at
    no swizzle:    start + (r / 8) sbo + (r % 8) 16 + (kb / 16) lbo + kb % 16
    T-byte swizzle: o = start + (r / 8) sbo + (r % 8) T + (kb / T) lbo + kb % T, then the
                   16-byte chunk bits 4.. of o XOR bits 7.. (T / 16 - 1 of them)
with offsets from the block's shared-memory base (a 1024-byte-aligned address on the GPU).
An N-major B (trans_b) element (n, k) at nb = n * size, T-byte swizzle, is read at
    o = start + (nb / T) lbo + nb % T + (k / 8) sbo + (k % 8) T, then the same XOR
and without swizzle at start + (nb / 16) sbo + nb % 16 + (k / 8) lbo + (k % 8) 16.
A from registers: element (r, k) of warp w's 16 rows is in the 4 words its lane 4 (r % 8) +
(k % (K/2)) / per_word published, word (r % 16) / 8 + 2 (k / (K/2)), as mma.sync's A."""
from __future__ import annotations

from llvmlite import ir

from ..lower import fp8, ops
from ..types import ScalarType, bf16, f16, i32
from . import cpu_abi as abi
from .cpu_thread_state import Loop

I1, I8, I16, I32, I64, F32 = (ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32),
                              ir.IntType(64), ir.FloatType())
SWIZZLE_BYTES = {0: 0, 1: 128, 2: 64, 3: 32}


def _c(v, ty=I32):
    return ir.Constant(ty, v)


def shared_address(fl, ptr):
    """Offset from this block's shared-memory base (what the GPU's shared window address is
    for a block whose shared memory starts at 0)."""
    b, target = fl.b, fl.ctx.target
    base = target.ctx_slot(fl.ctx, abi.SHARED_PTR)
    return b.trunc(b.sub(b.ptrtoint(ptr, I64), base), I32)


def _convert(b, kind, raw):
    """An operand element's raw bits (i8 / i16) -> f32 or i32."""
    if kind == "s8":
        return b.sext(raw, I32)
    if kind == "u8":
        return b.zext(raw, I32)
    if kind in ("e4m3", "e5m2"):
        return fp8.decode(b, raw, kind)
    ty = f16 if kind == "f16" else bf16
    return ops.to_f32(b, ty, b.bitcast(raw, ir.HalfType()) if kind == "f16" else raw)


def _desc_offset(b, desc, r, k, size, mn_major=False):
    """The shared offset (i64) of element (r, k) of the operand a descriptor describes: K-major,
    or with mn_major (B of trans_b) N-major, where r runs along the contiguous bytes."""
    def field(shift):
        return b.shl(b.and_(b.lshr(desc, _c(shift, I64)), _c(0x3FFF, I64)), _c(4, I64))
    start, lbo, sbo = field(0), field(16), field(32)
    mode = b.lshr(desc, _c(62, I64))
    width = b.select(b.icmp_unsigned("==", mode, _c(0, I64)), _c(16, I64),
                     b.select(b.icmp_unsigned("==", mode, _c(1, I64)), _c(128, I64),
                              b.select(b.icmp_unsigned("==", mode, _c(2, I64)), _c(64, I64),
                                       _c(32, I64))))
    if mn_major:
        off = _mn_major_offset(b, start, lbo, sbo, mode, width, b.zext(r, I64),
                               b.zext(k, I64), size)
    else:
        off = _k_major_offset(b, start, lbo, sbo, width, b.zext(r, I64), b.zext(k, I64), size)
    # swizzle: chunk bits 4.. ^= bits 7..; the mask is width / 16 - 1 (0 without swizzle)
    mask = b.select(b.icmp_unsigned("==", mode, _c(0, I64)), _c(0, I64),
                    b.sub(b.udiv(width, _c(16, I64)), _c(1, I64)))
    return b.xor(off, b.shl(b.and_(b.lshr(off, _c(7, I64)), mask), _c(4, I64)))


def _k_major_offset(b, start, lbo, sbo, width, r, k, size):
    """Element (r, k), k contiguous: 8-row groups sbo apart, rows `width` bytes apart inside
    one (16 without swizzle), and along K `width`-byte spans lbo apart."""
    kb = b.mul(k, _c(size, I64))
    off = b.add(start, b.mul(b.udiv(r, _c(8, I64)), sbo))
    off = b.add(off, b.mul(b.urem(r, _c(8, I64)), width))
    return b.add(off, b.add(b.mul(b.udiv(kb, width), lbo), b.urem(kb, width)))


def _mn_major_offset(b, start, lbo, sbo, mode, width, n, k, size):
    """Element (n, k), n contiguous (CUTLASS's canonical MN-major layouts): swizzled, rows of
    K `width` bytes apart in groups of 8 sbo apart, `width`-byte spans along N lbo apart;
    without swizzle 16-byte spans along N sbo apart, k % 8 16 bytes apart, groups of 8 k lbo
    apart (the two offsets trade places)."""
    nb = b.mul(n, _c(size, I64))
    plain = b.icmp_unsigned("==", mode, _c(0, I64))
    n_step, k_group = b.select(plain, sbo, lbo), b.select(plain, lbo, sbo)
    off = b.add(start, b.add(b.urem(nb, width), b.mul(b.udiv(nb, width), n_step)))
    off = b.add(off, b.mul(b.urem(k, _c(8, I64)), width))
    return b.add(off, b.mul(b.udiv(k, _c(8, I64)), k_group))


class _Operands:
    """Reads A and B elements for one thread: from shared memory through descriptors, A also
    from the warp's published fragment words."""

    def __init__(self, fl, site, spec, a, b_desc):
        self.fl, self.spec, self.site = fl, spec, site
        self.b, self.target = fl.b, fl.ctx.target
        b = self.b
        self.shared = self.target.ctx_slot(fl.ctx, abi.SHARED_PTR)
        limit = b.add(self.target.ctx_slot(fl.ctx, abi.DYN_BYTES), _c(fl.ctx.shared_bytes, I64))
        self.limit = limit
        self.b_desc = b_desc.ir
        self.a_desc = a.ir if isinstance(a.ty, ScalarType) else None
        tlin = fl.ctx.target_data["tlin"]
        self.lane = b.and_(tlin, _c(31))
        self.warp_base = b.sub(tlin, self.lane)
        self.warp_in_group = b.and_(b.lshr(tlin, _c(5)), _c(3))
        if self.a_desc is None:
            words = [b.zext(b.load(b.gep(a.ir, [_c(j)])), I64) for j in range(4)]
            self.slots, self.half, _ = self.target.exchange_words(fl.ctx, words, site)

    def _shared(self, desc, r, k, kind, mn_major=False):
        b, size = self.b, self.spec.elem_bytes
        off = _desc_offset(b, desc, r, k, size, mn_major)
        ok = b.icmp_unsigned("<=", b.add(off, _c(size, I64)), self.limit)
        with b.if_then(b.not_(ok), likely=False):
            self.target.fail(self.fl.ctx, 1, self.site, off)
        addr = b.add(self.shared, b.select(ok, off, _c(0, I64)))
        raw = b.load(b.inttoptr(addr, ir.IntType(8 * size).as_pointer()), align=1)
        return _convert(b, kind, raw)

    def a(self, row, k):
        if self.a_desc is not None:
            return self._shared(self.a_desc, row, k, self.spec.a_kind)
        b, spec = self.b, self.spec
        per_word = 4 // spec.elem_bytes
        sub = spec.k // 2
        r16 = b.urem(row, _c(16))
        lane = b.add(b.mul(b.urem(r16, _c(8)), _c(4)), b.udiv(b.urem(k, _c(sub)), _c(per_word)))
        word_idx = b.add(b.udiv(r16, _c(8)), b.mul(b.udiv(k, _c(sub)), _c(2)))
        word = self._fetch(b.add(self.warp_base, lane), word_idx)
        shift = b.mul(b.urem(k, _c(per_word)), _c(8 * spec.elem_bytes))
        raw = b.trunc(b.lshr(word, shift), ir.IntType(8 * spec.elem_bytes))
        return _convert(b, spec.a_kind, raw)

    def _fetch(self, thread, word_idx):
        """Word word_idx (runtime, 0..3) that `thread` published."""
        b = self.b
        words = [self.target.fetch_word(self.fl.ctx, self.slots, self.half, thread, j)
                 for j in range(4)]
        out = words[0]
        for j in range(1, 4):
            out = b.select(b.icmp_unsigned("==", word_idx, _c(j)), words[j], out)
        return out

    def b_elem(self, col, k):
        return self._shared(self.b_desc, col, k, self.spec.b_kind, self.spec.trans_b)


def wgmma(fl, node, spec, acc, a, b_desc, scale):
    site = fl.ctx.site(fl, node, "wgmma operand outside shared memory")
    b = fl.b
    ops_ = _Operands(fl, site, spec, a, b_desc)
    is_int = spec.acc_ty is i32
    zero = _c(0) if is_int else ir.Constant(F32, 0.0)
    g, t = b.lshr(ops_.lane, _c(2)), b.and_(ops_.lane, _c(3))
    total = fl.ctx.alloca(I32 if is_int else F32, "wgmma.sum")
    with Loop(b, _c(0), _c(acc.ty.count), "wgmma.i") as i:
        row = b.add(b.add(b.mul(ops_.warp_in_group, _c(16)), g),
                    b.mul(b.and_(b.lshr(i, _c(1)), _c(1)), _c(8)))
        col = b.add(b.add(b.mul(b.lshr(i, _c(2)), _c(8)), b.mul(t, _c(2))), b.and_(i, _c(1)))
        slot = b.gep(acc.ir, [i])
        b.store(b.select(scale.ir, b.load(slot), zero), total)
        with Loop(b, _c(0), _c(spec.k), "wgmma.k") as k:
            x, y = ops_.a(row, k), ops_.b_elem(col, k)
            prod = b.mul(x, y) if is_int else b.fmul(x, y)
            old = b.load(total)
            b.store(b.add(old, prod) if is_int else b.fadd(old, prod), total)
        b.store(b.load(total), slot)
    return True


HOPPER_INTRINSICS = {"shared_address": shared_address, "wgmma": wgmma}
