"""Bit manipulation (CUDA's __popc, __clz, __brev, __ffs, __byte_perm, __funnelshift_l/r and
their 64-bit forms): portable LLVM intrinsics (llvm.ctpop, llvm.ctlz,
llvm.bitreverse, llvm.fshl / llvm.fshr) that both targets lower natively, so neither target
table has an entry. Input: integer operands; output: IR values."""
from __future__ import annotations

from llvmlite import ir

from ..lower.values import Value, describe
from ..types import i32, i64, u32, u64
from .base import args_of, intrinsic
from .packed import prmt_ir

I1, I32 = ir.IntType(1), ir.IntType(32)
WORD_TYPES = (i32, u32, i64, u64)


def _word(fl, node, val, name: str, types=WORD_TYPES) -> Value:
    """A runtime i32 / u32 / i64 / u64 (literals: i32, or i64 when they need it)."""
    val = fl.materialize(val, node)
    if not isinstance(val, Value) or val.ty not in types:
        raise fl.error(node, f"pk.{name} takes {' / '.join(map(str, types))}, got "
                       f"{describe(val)}", hint="convert explicitly, e.g. u32(x)")
    return val


def _to_i32(fl, v):
    return v if v.type == I32 else fl.b.trunc(v, I32)


@intrinsic("popc")
def popc(fl, node):
    """`pk.popc(x)` -> i32: the number of set bits (`popc.b32` / `popc.b64`)."""
    (x,), _ = args_of(fl, node, 1, "popc")
    x = _word(fl, node, x, "popc")
    fn = fl.ctx.intrinsic_decl("llvm.ctpop", x.ty.llvm)
    return Value(i32, _to_i32(fl, fl.b.call(fn, [x.ir])))


@intrinsic("clz")
def clz(fl, node):
    """`pk.clz(x)` -> i32: leading zero bits, 32 (64) for 0 (`clz.b32` / `clz.b64`)."""
    (x,), _ = args_of(fl, node, 1, "clz")
    x = _word(fl, node, x, "clz")
    fn = fl.ctx.intrinsic_decl("llvm.ctlz", x.ty.llvm, ret=x.ty.llvm, args=(x.ty.llvm, I1))
    return Value(i32, _to_i32(fl, fl.b.call(fn, [x.ir, ir.Constant(I1, 0)])))


@intrinsic("brev")
def brev(fl, node):
    """`pk.brev(x)`: the bits in reverse order, same type (`brev.b32` / `brev.b64`)."""
    (x,), _ = args_of(fl, node, 1, "brev")
    x = _word(fl, node, x, "brev")
    fn = fl.ctx.intrinsic_decl("llvm.bitreverse", x.ty.llvm)
    return Value(x.ty, fl.b.call(fn, [x.ir]))


@intrinsic("ffs")
def ffs(fl, node):
    """`pk.ffs(x)` -> i32: 1 + the index of the lowest set bit, 0 for 0 (CUDA's __ffs):
    bits - clz(x & -x), branch-free (`neg`, `and`, `clz`, `sub`)."""
    (x,), _ = args_of(fl, node, 1, "ffs")
    x = _word(fl, node, x, "ffs")
    b, ty = fl.b, x.ty.llvm
    lowest = b.and_(x.ir, b.neg(x.ir))
    fn = fl.ctx.intrinsic_decl("llvm.ctlz", ty, ret=ty, args=(ty, I1))
    lz = _to_i32(fl, b.call(fn, [lowest, ir.Constant(I1, 0)]))
    return Value(i32, b.sub(ir.Constant(I32, x.ty.bits), lz))


@intrinsic("byte_perm")
def byte_perm(fl, node):
    """`pk.byte_perm(x, y, s)` -> u32: byte i of the result is byte `(s >> 4i) & 7` of the 8
    bytes y:x (x = bytes 0-3), CUDA's __byte_perm (`prmt.b32` with the selector's bit 3 of
    each nibble cleared: no sign replication)."""
    a, b_, s = (fl.coerce(v, u32, node) for v in args_of(fl, node, 3, "byte_perm")[0])
    sel = Value(u32, fl.b.and_(s.ir, ir.Constant(I32, 0x7777)))
    return Value(u32, prmt_ir(fl, a, b_, sel))


def _funnel(direction: str):
    llvm_name = "llvm.fshl" if direction == "l" else "llvm.fshr"

    def lower(fl, node):
        (lo, hi, shift), _ = args_of(fl, node, 3, f"funnel_shift_{direction}")
        lo, hi = (_word(fl, node, v, f"funnel_shift_{direction}", (i32, u32)) for v in (lo, hi))
        if lo.ty != hi.ty:
            raise fl.error(node, f"pk.funnel_shift_{direction}: lo is {lo.ty}, hi is {hi.ty}",
                           hint="convert one of them, e.g. u32(x)")
        shift = _word(fl, node, shift, f"funnel_shift_{direction}", (i32, u32))
        fn = fl.ctx.intrinsic_decl(llvm_name, I32, ret=I32, args=(I32, I32, I32))
        return Value(lo.ty, fl.b.call(fn, [hi.ir, lo.ir, shift.ir]))
    word = "high" if direction == "l" else "low"
    lower.__doc__ = (f"`pk.funnel_shift_{direction}(lo, hi, shift)`: the {word} 32 bits of the "
                     f"64-bit hi:lo shifted {'left' if direction == 'l' else 'right'} by "
                     f"shift & 31 (CUDA's __funnelshift_{direction}; `shf.{direction}.wrap.b32`).")
    return intrinsic(f"funnel_shift_{direction}")(lower)


funnel_shift_l = _funnel("l")
funnel_shift_r = _funnel("r")
