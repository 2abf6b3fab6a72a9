"""Packed-register intrinsics: byte permutes (`pk.prmt`) and arithmetic on two f16 held in one
u32 (`pk.add_f16x2`, `pk.sub_f16x2`, `pk.mul_f16x2`). On the GPU each is one PTX instruction
(targets/nvptx_intrinsics.py); the portable IR here, which the CPU target runs, computes the
same bits (f16 results correctly rounded: the f32 operation
rounded to f16 once, which for +, -, x of f16 operands is the f16 operation's rounding)."""
from __future__ import annotations

from llvmlite import ir

from ..lower import ops
from ..lower.values import Value
from ..types import f16, u32
from .base import args_of, intrinsic

I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)


def _u32_args(fl, node, count: int, name: str) -> list:
    args, _ = args_of(fl, node, count, name)
    return [fl.coerce(a, u32, node) for a in args]


@intrinsic("prmt")
def prmt(fl, node):
    """`pk.prmt(a, b, selector)` -> u32: byte i of the result is byte (nibble i of selector) & 7
    of the 8-byte value b:a (a's bytes 0-3, b's 4-7); a nibble with bit 3 set gives that byte's
    sign replicated instead (`prmt.b32`, default mode)."""
    a, b, sel = _u32_args(fl, node, 3, "prmt")
    return Value(u32, prmt_ir(fl, a, b, sel))


def prmt_ir(fl, a: Value, b: Value, sel: Value) -> ir.Value:
    """pk.prmt on checked u32 operands: the target's instruction, else the portable IR."""
    lowered = fl.ctx.target.lower_intrinsic("prmt", fl, a, b, sel)
    if lowered is not None:
        return lowered
    bld = fl.b
    both = bld.or_(bld.zext(a.ir, I64), bld.shl(bld.zext(b.ir, I64), ir.Constant(I64, 32)))
    out = ir.Constant(I32, 0)
    for i in range(4):
        nibble = bld.and_(bld.lshr(sel.ir, ir.Constant(I32, 4 * i)), ir.Constant(I32, 15))
        shift = bld.zext(bld.mul(bld.and_(nibble, ir.Constant(I32, 7)), ir.Constant(I32, 8)), I64)
        byte = bld.trunc(bld.lshr(both, shift), I8)
        sign = bld.select(bld.icmp_signed("<", byte, ir.Constant(I8, 0)), ir.Constant(I8, 255),
                          ir.Constant(I8, 0))
        replicate = bld.icmp_unsigned("!=", bld.and_(nibble, ir.Constant(I32, 8)),
                                      ir.Constant(I32, 0))
        picked = bld.zext(bld.select(replicate, sign, byte), I32)
        out = bld.or_(out, bld.shl(picked, ir.Constant(I32, 8 * i)))
    return out


def _halves(bld, word):
    """The two f16 of a u32 (low first) as f32."""
    out = []
    for shift in (0, 16):
        bits = bld.trunc(bld.lshr(word, ir.Constant(I32, shift)), ir.IntType(16))
        out.append(ops.to_f32(bld, f16, bld.bitcast(bits, ir.HalfType())))
    return out


def _packed(bld, lo, hi):
    """Two f32 rounded to f16 (to nearest even) as one u32, lo in the low half."""
    words = [bld.zext(bld.bitcast(ops.from_f32(bld, f16, v), ir.IntType(16)), I32)
             for v in (lo, hi)]
    return bld.or_(words[0], bld.shl(words[1], ir.Constant(I32, 16)))


def _f16x2_op(name: str, ptx: str, apply):
    def lower(fl, node):
        a, b = _u32_args(fl, node, 2, name)
        lowered = fl.ctx.target.lower_intrinsic("f16x2", fl, node, ptx, a, b)
        if lowered is not None:
            return Value(u32, lowered)
        bld = fl.b
        (a0, a1), (b0, b1) = _halves(bld, a.ir), _halves(bld, b.ir)
        return Value(u32, _packed(bld, apply(bld, a0, b0), apply(bld, a1, b1)))
    lower.__doc__ = (f"`pk.{name}(a, b)` -> u32: both f16 halves of a and b (u32 words as "
                     f"pk.pack_f16x2 makes them) {ptx}'d lane by lane, rounded to nearest "
                     f"even (`{ptx}.rn.f16x2`, sm_53+).")
    return intrinsic(name)(lower)


add_f16x2 = _f16x2_op("add_f16x2", "add", lambda b, x, y: b.fadd(x, y))
sub_f16x2 = _f16x2_op("sub_f16x2", "sub", lambda b, x, y: b.fsub(x, y))
mul_f16x2 = _f16x2_op("mul_f16x2", "mul", lambda b, x, y: b.fmul(x, y))
