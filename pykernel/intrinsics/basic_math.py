"""Math that maps to one LLVM intrinsic / PTX instruction: sqrt (sqrt.rn), floor (cvt.rmi),
ceil (cvt.rpi), fma (fma.rn), trunc/round. f16/bf16 inputs compute in f32 and round back,
except fma (lower/ops.py: in the half type where the target has it)."""
from __future__ import annotations

from ..lower import ops
from ..lower.values import ConstValue, Value, describe
from ..types import f32, f64
from .base import args_of, intrinsic


def float_args(fl, node, name, count, packed=False):
    """The float arguments of pk.<name>, of one type (packed f16x2 / bf16x2 where allowed)."""
    args, _ = args_of(fl, node, count, name)
    runtime = [a for a in args if isinstance(a, Value)]
    ty = runtime[0].ty if runtime else f32
    out = []
    for a in args:
        v = fl.coerce(a, ty, node) if isinstance(a, ConstValue) else a
        ok_type = v.ty.is_float or (packed and ops.is_packed(v.ty)) if isinstance(v, Value) \
            else False
        if not ok_type or v.ty != ty:
            raise fl.error(node, f"pk.{name} needs float arguments of one type, got "
                           f"{describe(v)}", hint="convert explicitly, e.g. f32(x)")
        out.append(v)
    return out, ty


def compute_type(ty):
    return ty if ty in (f32, f64) else f32


def llvm_unary(llvm_name):
    def lower(fl, node):
        (x,), ty = float_args(fl, node, lower.name, 1)
        ct = compute_type(ty)
        v = ops.cast(fl.b, ty, ct, x.ir)
        r = fl.b.call(fl.ctx.intrinsic_decl(llvm_name, ct.llvm), [v])
        return Value(ty, ops.cast(fl.b, ct, ty, r))
    return lower


def _make(name, llvm_name, doc):
    fn = llvm_unary(llvm_name)
    fn.name = name
    fn.__doc__ = doc
    return intrinsic(name)(fn)


sqrt = _make("sqrt", "llvm.sqrt", "Correctly rounded square root: `sqrt.rn.f32` (0 ulp).")
floor = _make("floor", "llvm.floor", "Round toward -inf: `cvt.rmi.f32.f32` (exact).")
ceil = _make("ceil", "llvm.ceil", "Round toward +inf: `cvt.rpi.f32.f32` (exact).")
trunc = _make("trunc", "llvm.trunc", "Round toward zero: `cvt.rzi.f32.f32` (exact).")
rint = _make("rint", "llvm.rint", "Round to nearest even: `cvt.rni.f32.f32` (exact).")


@intrinsic("fma")
def fma(fl, node):
    """Fused multiply-add a*b+c with one rounding: `fma.rn.f32` (0 ulp); f16/bf16 in their
    own type (`fma.rn.f16`, `fma.rn.bf16` sm_80+), else emulated with the same rounding."""
    (a, b, c), ty = float_args(fl, node, "fma", 3, packed=True)
    half = ty.elem if ops.is_packed(ty) else ty
    native = ops.is_half(half) and fl.ctx.target.half_native(half, "fma")
    return Value(ty, ops.float_fma(fl.b, ty, a.ir, b.ir, c.ir, fl.ctx.intrinsic_decl, native))


@intrinsic("rsqrt")
def rsqrt(fl, node):
    """1/sqrt(x) from two correctly rounded operations (<= 1 ulp)."""
    (x,), ty = float_args(fl, node, "rsqrt", 1)
    ct = compute_type(ty)
    v = ops.cast(fl.b, ty, ct, x.ir)
    s = fl.b.call(fl.ctx.intrinsic_decl("llvm.sqrt", ct.llvm), [v])
    r = fl.b.fdiv(ops.const_ir(ct, 1.0), s)
    return Value(ty, ops.cast(fl.b, ct, ty, r))
