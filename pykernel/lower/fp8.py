"""The 8-bit float formats in IR: decode to f32 (exact) and encode from f32 with the
hardware's `cvt.rn.satfinite` rounding (nearest even; finite overflow saturates to the largest
finite value, infinities too; NaN -> 0x7F with the sign). Used by the CPU target and by
pre-sm_89 NVPTX; pykernel/fp8.py holds the numpy codecs the tests compare against.

    e4m3: s eeee mmm, bias 7, no infinities, NaN = s 1111 111, max 448
    e5m2: s eeeee mm, bias 15 (the top byte of an f16), NaN = exponent 31 and m != 0,
          max 57344
"""
from __future__ import annotations

from llvmlite import ir

I8, I32, F32, F64 = ir.IntType(8), ir.IntType(32), ir.FloatType(), ir.DoubleType()
# format -> (exponent bits, mantissa bits, bias, largest finite)
FORMATS = {"e4m3": (4, 3, 7, 448.0), "e5m2": (5, 2, 15, 57344.0)}


def _c(v, ty=I32):
    return ir.Constant(ty, v)


def decode(b: ir.IRBuilder, byte, fmt: str):
    """An i8 holding an fp8 code -> its f32 value (exact)."""
    ebits, mbits, bias, _ = FORMATS[fmt]
    code = b.zext(byte, I32)
    sign = b.shl(b.lshr(code, _c(7)), _c(31))
    exp = b.and_(b.lshr(code, _c(mbits)), _c((1 << ebits) - 1))
    man = b.and_(code, _c((1 << mbits) - 1))
    normal = b.or_(b.shl(b.add(exp, _c(127 - bias)), _c(23)), b.shl(man, _c(23 - mbits)))
    # subnormal: man * 2^(1 - bias - mbits), exact in f32
    sub = b.fmul(b.uitofp(man, F32), ir.Constant(F32, 2.0 ** (1 - bias - mbits)))
    sub_bits = b.bitcast(sub, I32)
    bits = b.select(b.icmp_unsigned("==", exp, _c(0)), sub_bits, normal)
    top = _c((1 << ebits) - 1)
    if fmt == "e4m3":
        nan = b.and_(b.icmp_unsigned("==", exp, top), b.icmp_unsigned("==", man, _c(7)))
    else:
        inf = b.icmp_unsigned("==", exp, top)
        bits = b.select(inf, _c(0x7F800000), bits)
        nan = b.and_(inf, b.icmp_unsigned("!=", man, _c(0)))
    # every NaN code decodes to 0x7FFFFFFF, sign dropped: what sm_89+'s cvt gives (H200)
    return b.bitcast(b.select(nan, _c(0x7FFFFFFF), b.or_(bits, sign)), F32)


def encode(b: ir.IRBuilder, module, value, fmt: str):
    """An f32 -> the i8 fp8 code, `cvt.rn.satfinite`: |x| is rounded to the format's grid at
    its binade (exact in f64, roundeven), saturated at the largest finite value."""
    _, mbits, bias, top = FORMATS[fmt]
    bits = b.bitcast(value, I32)
    sign = b.trunc(b.shl(b.lshr(bits, _c(31)), _c(7)), I8)
    mag = b.fpext(b.bitcast(b.and_(bits, _c(0x7FFFFFFF)), F32), F64)
    # the binade's unit in the last place: 2^(max(e, 1 - bias) - mbits), e = floor(log2 |x|)
    e32 = b.sub(b.and_(b.lshr(bits, _c(23)), _c(0xFF)), _c(127))
    e = b.select(b.icmp_signed("<", e32, _c(1 - bias)), _c(1 - bias), e32)
    ulp_bits = b.shl(b.zext(b.add(b.sub(e, _c(mbits)), _c(1023)), ir.IntType(64)),
                     ir.Constant(ir.IntType(64), 52))
    ulp = b.bitcast(ulp_bits, F64)
    roundeven = module.globals.get("llvm.roundeven.f64") or ir.Function(
        module, ir.FunctionType(F64, [F64]), "llvm.roundeven.f64")
    steps = b.call(roundeven, [b.fdiv(mag, ulp)])
    rounded = b.fmul(steps, ulp)
    rounded = b.select(b.fcmp_ordered(">", rounded, ir.Constant(F64, top)),
                       ir.Constant(F64, top), rounded)
    # rounded = (1 + m / 2^mbits) * 2^E or m * 2^(1 - bias - mbits): read E and m from its bits
    rbits = b.bitcast(rounded, ir.IntType(64))
    rexp = b.trunc(b.lshr(rbits, ir.Constant(ir.IntType(64), 52)), I32)
    rman = b.trunc(b.lshr(rbits, ir.Constant(ir.IntType(64), 52 - mbits)), I32)
    rman = b.and_(rman, _c((1 << mbits) - 1))
    field = b.add(b.sub(rexp, _c(1023)), _c(bias))
    normal = b.or_(b.shl(field, _c(mbits)), rman)
    subnormal = b.fptoui(b.fdiv(rounded, ir.Constant(F64, 2.0 ** (1 - bias - mbits))), I32)
    code = b.select(b.icmp_signed(">", field, _c(0)), normal, subnormal)
    code = b.trunc(code, I8)
    nan = b.fcmp_unordered("uno", value, value)
    return b.select(nan, b.or_(sign, ir.Constant(I8, 0x7F)), b.or_(sign, code))
