"""Scalar operations with C semantics for ints (Python floor semantics for // and % on signed
ints), IEEE floats, f16/bf16 arithmetic and explicit casts.

f16/bf16 `+ - *`, fma, min/max and comparisons compute in the half type itself where the
target says it has the instruction (`target.half_native(ty, op)`: NVPTX `add.rn.f16`,
`fma.rn.bf16`, `setp.lt.bf16` ...; LLVM expands what an arch lacks, exactly); elsewhere (the CPU
target, bf16 fma before sm_80) they are emulated with the same rounding: + - * min max in f32
rounded once to the half type (f32 has more than 2p+2 bits, so the double rounding is
innocuous), fma in f64 rounded to odd to f32 and then to nearest even. Negation and abs are
sign-bit operations (NaN payloads kept, as numpy does). /, // and % compute in f32."""
from __future__ import annotations

import ast

from llvmlite import ir

from ..types import INT_RANGES, ScalarType, bf16, bool_, common_int_literal_type, f16, f32
from . import fp8
from .round_odd import fma_f64_to_odd_f32

F32 = ir.FloatType()
F64 = ir.DoubleType()
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)


class BFloatType(ir.types._BaseFloatType):
    """LLVM's `bfloat` (llvmlite has no such type). bf16 values live as i16 bits and become
    `bfloat` only around the operations computed in bf16 (bitcasts cost nothing)."""
    null = "0.0"
    intrinsic_name = "bf16"

    def __str__(self):
        return "bfloat"


BFloatType._create_instance()
BFLOAT = BFloatType()


class TypeMismatch(Exception):
    """Raised by helpers here; the lowering turns it into a KernelSourceError at the node."""

    def __init__(self, message, hint=None):
        super().__init__(message)
        self.hint = hint


def literal_type(value) -> ScalarType:
    if isinstance(value, bool):
        return bool_
    if isinstance(value, int):
        return common_int_literal_type(value)
    if isinstance(value, float):
        return f32
    raise TypeMismatch(f"a {type(value).__name__} value cannot be used in a kernel")


def const_ir(ty: ScalarType, value) -> ir.Constant:
    """An LLVM constant of DSL type `ty` for a Python value (checked to fit)."""
    if not isinstance(value, (bool, int, float)):   # e.g. x[0] = 'a'
        raise TypeMismatch(f"the constant {value!r} cannot be used as a {ty} value")
    if ty.kind == "bool":
        return ir.Constant(ir.IntType(1), int(bool(value)))
    if ty.is_fp8:                      # a literal next to an fp8 value: its code, as the host
        return ir.Constant(ir.IntType(8), int(ty(float(value))))   # encodes it
    if ty.is_int:
        if isinstance(value, float):
            raise TypeMismatch(f"float literal {value!r} used where {ty} is expected",
                               hint=f"convert explicitly, e.g. {ty}({value!r})")
        lo, hi = INT_RANGES[ty.name]
        v = int(value)
        if not lo <= v <= hi:
            shown = str(v) if v.bit_length() <= 128 else f"of {v.bit_length()} bits"
            raise TypeMismatch(f"literal {shown} does not fit in {ty} (range {lo}..{hi})")
        return ir.Constant(ty.llvm, v & ((1 << ty.bits) - 1))
    if is_packed(ty):                  # a literal next to a packed pair: both lanes
        return ir.Constant(ty.llvm, [const_ir(ty.elem, value)] * ty.lanes)
    if ty is bf16:
        import numpy as np
        bits = int(np.array(float(value), np.float32).view(np.uint32))
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 if (bits & 0x7FFFFFFF) <= 0x7F800000 \
            else 0x7FC0
        return ir.Constant(ir.IntType(16), bits & 0xFFFF)
    return ir.Constant(ty.llvm, float(value))


# --- f16 / bf16: stored as their own type, computed in f32 ------------------------------------

def to_f32(b: ir.IRBuilder, ty: ScalarType, v):
    if ty is f32:
        return v
    if ty is bf16:
        wide = b.shl(b.zext(v, I32), ir.Constant(I32, 16))
        return b.bitcast(wide, F32)
    return b.fpext(v, F32) if ty.bits < 32 else b.fptrunc(v, F32)


def from_f32(b: ir.IRBuilder, ty: ScalarType, v):
    if ty is f32:
        return v
    if ty is bf16:  # round to nearest even; NaN stays a quiet NaN
        bits = b.bitcast(v, I32)
        lsb = b.and_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 1))
        rounded = b.add(b.add(bits, ir.Constant(I32, 0x7FFF)), lsb)
        is_nan = b.fcmp_unordered("uno", v, v)
        out = b.select(is_nan, ir.Constant(I32, 0x7FC00000), rounded)
        return b.trunc(b.lshr(out, ir.Constant(I32, 16)), ir.IntType(16))
    return b.fptrunc(v, ty.llvm) if ty.bits < 32 else b.fpext(v, ty.llvm)


def is_half(ty: ScalarType) -> bool:
    return ty is f16 or ty is bf16


def is_packed(ty) -> bool:
    return getattr(ty, "lanes", 0) > 1


def as_half(b: ir.IRBuilder, ty: ScalarType, v):
    """A stored f16/bf16 value (or packed pair) as the LLVM type that computes in it
    (`half`, `bfloat`, `<2 x half>`, `<2 x bfloat>`)."""
    if is_packed(ty):
        return b.bitcast(v, ir.VectorType(BFLOAT, ty.lanes)) if ty.elem is bf16 else v
    return b.bitcast(v, BFLOAT) if ty is bf16 else v


def from_half(b: ir.IRBuilder, ty: ScalarType, v):
    if is_packed(ty):
        return b.bitcast(v, ty.llvm) if ty.elem is bf16 else v
    return b.bitcast(v, I16) if ty is bf16 else v


def compute_type(ty: ScalarType) -> ir.Type:
    """The LLVM type a half (or packed) value computes in natively."""
    if is_packed(ty):
        return ir.VectorType(compute_type(ty.elem), ty.lanes)
    return BFLOAT if ty is bf16 else ty.llvm


def half_bits(b: ir.IRBuilder, ty: ScalarType, v):
    if is_packed(ty):
        return b.bitcast(v, ir.VectorType(I16, ty.lanes))
    return v if ty is bf16 else b.bitcast(v, I16)


def bits_to_half(b: ir.IRBuilder, ty: ScalarType, bits):
    return bits if ty is bf16 else b.bitcast(bits, ty.llvm)


def _sign_mask(ty: ScalarType, value: int) -> ir.Constant:
    if is_packed(ty):
        return ir.Constant(ir.VectorType(I16, ty.lanes), [value] * ty.lanes)
    return ir.Constant(I16, value)


# --- packed pairs: one vector operation, or lane by lane where the target lacks it ---------

def lanes_of(b: ir.IRBuilder, ty: ScalarType, v) -> list:
    return [b.extract_element(v, ir.Constant(I32, k)) for k in range(ty.lanes)]


def pack_lanes(b: ir.IRBuilder, ty: ScalarType, values) -> ir.Value:
    out = ir.Constant(ty.llvm, ir.Undefined)
    for k, v in enumerate(values):
        out = b.insert_element(out, v, ir.Constant(I32, k))
    return out


def lane_by_lane(b: ir.IRBuilder, ty: ScalarType, scalar_op, *operands):
    """A packed operation as the element type's operation on each lane."""
    per_lane = zip(*(lanes_of(b, ty, v) for v in operands))
    return pack_lanes(b, ty, [scalar_op(*lane) for lane in per_lane])


# --- f16 / bf16 operations beyond + - * ---------------------------------------------------------

def negate(b: ir.IRBuilder, ty: ScalarType, v):
    """-x: the sign bit flipped (for halves an integer xor: NaN payloads kept on every target)."""
    if ty.is_fp8:
        raise TypeMismatch(f"cannot negate {ty} values", hint="compute in f32: -f32(x)")
    if is_half(ty) or is_packed(ty):
        return bits_to_half(b, ty, b.xor(half_bits(b, ty, v), _sign_mask(ty, 0x8000)))
    return b.fneg(v) if ty.is_float else b.neg(v)


def fabs(b: ir.IRBuilder, ty: ScalarType, v, decl):
    """|x| of a float: the sign bit cleared. `decl(name, llvm_type)` declares an intrinsic."""
    if is_half(ty) or is_packed(ty):
        return bits_to_half(b, ty, b.and_(half_bits(b, ty, v), _sign_mask(ty, 0x7FFF)))
    return b.call(decl("llvm.fabs", ty.llvm), [v])


def float_minmax(b: ir.IRBuilder, ty: ScalarType, x, y, is_max, decl, native=False):
    """IEEE maxNum/minNum (a NaN operand gives the other one): `max.f32`, `max.f16`..."""
    name = "llvm.maxnum" if is_max else "llvm.minnum"
    if (is_half(ty) or is_packed(ty)) and native:
        return from_half(b, ty, b.call(decl(name, compute_type(ty)),
                                       [as_half(b, ty, x), as_half(b, ty, y)]))
    if is_packed(ty):
        return lane_by_lane(b, ty, lambda p, q: float_minmax(b, ty.elem, p, q, is_max, decl),
                            x, y)
    if is_half(ty):   # min/max of two halves is one of them: exact in f32
        return from_f32(b, ty, b.call(decl(name, F32), [to_f32(b, ty, x), to_f32(b, ty, y)]))
    return b.call(decl(name, ty.llvm), [x, y])


def float_fma(b: ir.IRBuilder, ty: ScalarType, x, y, z, decl, native=False):
    """x*y+z rounded once (`fma.rn.f32`, `fma.rn.f16`, `fma.rn.bf16`)."""
    if not (is_half(ty) or is_packed(ty)) or native:
        vals = [as_half(b, ty, v) for v in (x, y, z)]
        return from_half(b, ty, b.call(decl("llvm.fma", compute_type(ty)), vals))
    if is_packed(ty):
        return lane_by_lane(b, ty, lambda p, q, r: float_fma(b, ty.elem, p, q, r, decl),
                            x, y, z)
    # x*y is exact in f64 (16 bits at most); the sum is rounded to odd in f64 (TwoSum gives
    # its exact error), then to odd in f32, then to nearest even in the half format: rounding
    # to odd with at least two more bits than the last rounding is a correct single rounding
    wide = [b.fpext(to_f32(b, ty, v), F64) for v in (x, y, z)]
    return from_f32(b, ty, fma_f64_to_odd_f32(b, *wide, decl))


# --- casts --------------------------------------------------------------------------------------

def cast(b: ir.IRBuilder, src: ScalarType, dst: ScalarType, v):
    """Explicit conversion `dst(v)`: C semantics (float->int truncates toward zero)."""
    if src is dst:
        return v
    if src.is_fp8 or dst.is_fp8:      # through f32 (the IR codecs; calls.lower_cast uses the
        return fp8_cast(b, src, dst, v)   # target's cvt where it has one)
    if is_packed(src) or is_packed(dst):
        raise TypeMismatch(f"cannot convert {src} to {dst}",
                           hint="build a pair with f16x2(a, b), read lanes as p.x / p.y, or "
                                "reinterpret bits with pk.bitcast(p, u32)")
    if dst.kind == "bool":
        if src.is_float:
            return b.fcmp_unordered("une", to_f32(b, src, v) if is_half(src) else v,
                                    ir.Constant(F32 if is_half(src) else src.llvm, 0.0))
        return b.icmp_unsigned("!=", v, ir.Constant(src.llvm, 0))
    if src.kind == "bool":
        if dst.is_float:
            return cast(b, f32, dst, b.uitofp(v, F32))
        return b.zext(v, dst.llvm)
    if src.is_int and dst.is_int:
        if dst.bits < src.bits:
            return b.trunc(v, dst.llvm)
        if dst.bits > src.bits:
            return b.sext(v, dst.llvm) if src.is_signed else b.zext(v, dst.llvm)
        return v
    if src.is_int and dst.is_float:
        mid = dst if not is_half(dst) else f32
        conv = b.sitofp(v, mid.llvm) if src.is_signed else b.uitofp(v, mid.llvm)
        return from_f32(b, dst, conv) if is_half(dst) else conv
    if src.is_float and dst.is_int:
        fv = to_f32(b, src, v) if is_half(src) else v
        return b.fptosi(fv, dst.llvm) if dst.is_signed else b.fptoui(fv, dst.llvm)
    # float -> float
    if is_half(src) and is_half(dst):
        return from_f32(b, dst, to_f32(b, src, v))
    if is_half(src):
        return cast(b, f32, dst, to_f32(b, src, v))
    if is_half(dst):
        return from_f32(b, dst, cast(b, src, f32, v))
    return b.fpext(v, dst.llvm) if dst.bits > src.bits else b.fptrunc(v, dst.llvm)


def fp8_cast(b: ir.IRBuilder, src: ScalarType, dst: ScalarType, v):
    """dst(v) where src or dst is e4m3 / e5m2: decode to f32 (exact), convert, encode from f32
    with cvt.rn.satfinite's rounding."""
    if src.is_fp8:
        v, src = fp8.decode(b, v, src.name), f32
    if dst.is_fp8:
        return fp8.encode(b, b.module, cast(b, src, f32, v), dst.name)
    return cast(b, src, dst, v)


# --- arithmetic ---------------------------------------------------------------------------------

OP_NAMES = {ast.Add: "add", ast.Sub: "subtract", ast.Mult: "multiply", ast.Div: "divide",
            ast.FloorDiv: "floor-divide", ast.Mod: "take the remainder of", ast.Pow: "raise",
            ast.LShift: "shift", ast.RShift: "shift", ast.BitAnd: "and", ast.BitOr: "or",
            ast.BitXor: "xor"}


def _floor_adjust(b, ty, r, y):
    """C's truncating division differs from Python's floor division exactly when the
    remainder is non-zero and its sign differs from the divisor's."""
    zero = ir.Constant(ty.llvm, 0)
    return b.and_(b.icmp_signed("!=", r, zero),
                  b.icmp_signed("!=", b.icmp_signed("<", r, zero), b.icmp_signed("<", y, zero)))


def int_binop(b: ir.IRBuilder, op, ty: ScalarType, x, y):
    signed = ty.is_signed
    if op is ast.Add:
        return b.add(x, y)
    if op is ast.Sub:
        return b.sub(x, y)
    if op is ast.Mult:
        return b.mul(x, y)
    if op is ast.FloorDiv:
        if not signed:
            return b.udiv(x, y)
        r = b.srem(x, y)
        return b.sub(b.sdiv(x, y), b.zext(_floor_adjust(b, ty, r, y), ty.llvm))
    if op is ast.Mod:
        if not signed:
            return b.urem(x, y)
        r = b.srem(x, y)
        return b.select(_floor_adjust(b, ty, r, y), b.add(r, y), r)
    if op is ast.LShift:
        return b.shl(x, y)
    if op is ast.RShift:
        return b.ashr(x, y) if signed else b.lshr(x, y)
    if op is ast.BitAnd:
        return b.and_(x, y)
    if op is ast.BitOr:
        return b.or_(x, y)
    if op is ast.BitXor:
        return b.xor(x, y)
    if op is ast.Div:
        raise TypeMismatch(f"'/' on integers ({ty}) is not defined in kernels",
                           hint="use // for integer division, or convert: f32(a) / f32(b)")
    raise TypeMismatch(f"operator {op.__name__} is not supported on {ty}")


def float_binop(b: ir.IRBuilder, op, ty: ScalarType, x, y, floor_fn, contract=False,
                native=False):
    """IEEE arithmetic; `contract` lets LLVM fuse a*b+c into one fma (fp_contract option);
    `native`: f16/bf16 + - * in the half type (the target has the instruction)."""
    if is_half(ty):
        if native and op in (ast.Add, ast.Sub, ast.Mult):
            r = float_binop(b, op, None, as_half(b, ty, x), as_half(b, ty, y), floor_fn, contract)
            return from_half(b, ty, r)
        r = float_binop(b, op, f32, to_f32(b, ty, x), to_f32(b, ty, y), floor_fn, contract)
        return from_f32(b, ty, r)
    flags = ("contract",) if contract else ()
    if op is ast.Add:
        return b.fadd(x, y, flags=flags)
    if op is ast.Sub:
        return b.fsub(x, y, flags=flags)
    if op is ast.Mult:
        return b.fmul(x, y, flags=flags)
    if op is ast.Div:
        return b.fdiv(x, y)
    if op is ast.FloorDiv:
        return floor_fn(ty, b.fdiv(x, y))
    if op is ast.Mod:  # Python: result has the sign of the divisor
        return b.fsub(x, b.fmul(floor_fn(ty, b.fdiv(x, y)), y))
    raise TypeMismatch(f"operator {OP_NAMES.get(op, op.__name__)} is not defined on {ty}",
                       hint="bit operations need integers: use pk.bitcast(x, u32)")


def packed_binop(b: ir.IRBuilder, op, ty: ScalarType, x, y, contract=False, native=False):
    """+ - * of two packed pairs: one `add.rn.f16x2` / `mul.rn.bf16x2` where the target has
    it (`native`), else lane by lane with the element type's rounding."""
    if op not in (ast.Add, ast.Sub, ast.Mult):
        raise TypeMismatch(f"operator {OP_NAMES.get(op, op.__name__)} is not defined on {ty}",
                           hint="packed pairs have + - *, pk.fma, min, max, abs and negation")
    if native:
        r = float_binop(b, op, None, as_half(b, ty, x), as_half(b, ty, y), None, contract)
        return from_half(b, ty, r)
    return lane_by_lane(b, ty, lambda p, q: float_binop(b, op, ty.elem, p, q, None, contract),
                        x, y)


CMP_OPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


def compare(b: ir.IRBuilder, op, ty: ScalarType, x, y, native=False):
    """`native`: f16/bf16 compared in the half type (`setp.lt.f16`); else in f32 (exact)."""
    sym = CMP_OPS.get(op)
    if sym is None:
        raise TypeMismatch(f"comparison {op.__name__} is not supported in kernels")
    if ty.is_fp8:
        raise TypeMismatch(f"{ty} values do not compare", hint="compare f32(a) < f32(b)")
    if is_packed(ty):
        raise TypeMismatch(f"{ty} values do not compare as a whole",
                           hint="compare lanes: p.x < q.x")
    if ty.is_float:
        if is_half(ty):
            convert = as_half if native else to_f32
            x, y = convert(b, ty, x), convert(b, ty, y)
        if sym == "!=":
            return b.fcmp_unordered("!=", x, y)
        return b.fcmp_ordered(sym, x, y)
    if ty.is_signed:
        return b.icmp_signed(sym, x, y)
    return b.icmp_unsigned(sym, x, y)


def index_to_i64(b: ir.IRBuilder, ty: ScalarType, v):
    if not ty.is_int:
        raise TypeMismatch(f"an index must be an integer, got {ty}")
    if ty.bits == 64:
        return v
    return b.sext(v, ir.IntType(64)) if ty.is_signed else b.zext(v, ir.IntType(64))
