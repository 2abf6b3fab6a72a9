"""Call lowering: casts `f32(x)`, builtins min/max/abs/print, `pk.*` intrinsics and @pk.func
calls."""
from __future__ import annotations

import builtins

from llvmlite import ir

from ..device_function import DeviceFunction
from ..types import ScalarType, bool_, f32
from . import fp8, ops
from .values import ConstValue, GlobalRef, PtrValue, TypeValue, Value, describe


def lower_call_node(fl, node):
    fn = fl.expr(node.func)
    if isinstance(fn, TypeValue):
        return lower_cast(fl, fn.ty, node)
    if not isinstance(fn, GlobalRef):
        raise fl.error(node.func, f"{describe(fn)} is not callable")
    obj = fn.obj
    from ..intrinsics.base import Intrinsic
    if isinstance(obj, Intrinsic):
        return obj.lower_call(fl, node)
    if isinstance(obj, DeviceFunction):
        from .functions import inline_call
        return inline_call(fl, obj, node)
    if obj in (builtins.min, builtins.max):
        return lower_minmax(fl, node, obj is builtins.max)
    if obj is builtins.abs:
        return lower_abs(fl, node)
    if obj is builtins.print:
        from .printing import lower_print
        return lower_print(fl, node)
    if obj is builtins.range:
        raise fl.error(node, "range() can only be used as the iterable of a for loop")
    if getattr(obj, "is_kernel", False) is True:     # a @pk.kernel (kernel.py)
        raise fl.error(node, f"kernel '{obj.name}' cannot be called from device code",
                       hint="make the shared code a @pk.func")
    name = getattr(obj, "__name__", repr(obj))
    raise fl.error(node, f"cannot call Python function '{name}' from a kernel",
                   hint=_call_hint(obj, name))


def _call_hint(obj, name: str) -> str | None:
    """A library function (math.exp, numpy.sqrt) has a pk intrinsic of the same name when
    one exists; only the user's own functions are worth decorating with @pk.func."""
    import pykernel
    module = getattr(obj, "__module__", None) or ""
    if module in ("math", "cmath", "builtins") or module.startswith("numpy") or \
            getattr(obj, "__self__", None) is not None:
        if callable(getattr(pykernel, name, None)):
            return f"use pk.{name}(...), the kernel intrinsic"
        return "library functions cannot run in kernels; see docs/language.md for intrinsics"
    return "decorate it with @pk.func to make it a device function" if callable(obj) else None


def positional(fl, node, count, name):
    if node.keywords or len(node.args) not in (count if isinstance(count, tuple) else (count,)):
        raise fl.error(node, f"{name} takes {count} positional argument(s)")
    return [fl.expr(a) for a in node.args]


def lower_cast(fl, ty: ScalarType, node):
    if ops.is_packed(ty):                     # f16x2(a, b): a pair, not a conversion
        from .expressions import construct_packed
        return construct_packed(fl, ty, node)
    (val,) = positional(fl, node, 1, f"{ty}()")
    if isinstance(val, ConstValue):
        if not isinstance(val.value, (bool, int, float)):
            raise fl.error(node, f"cannot convert {val.value!r} to {ty}")
        if ty.is_int and isinstance(val.value, float):
            val = ConstValue(int(val.value))
        return Value(ty, ops.const_ir(ty, val.value if ty is not bool_ else bool(val.value)))
    if not isinstance(val, Value):
        raise fl.error(node.args[0], f"cannot convert {describe(val)} to {ty}",
                       hint="pk.bitcast reinterprets bits" if isinstance(val, PtrValue) else None)
    if ty.is_fp8 or val.ty.is_fp8:
        return Value(ty, fp8_convert(fl, val.ty, ty, val.ir))
    return Value(ty, ops.cast(fl.b, val.ty, ty, val.ir))


def fp8_convert(fl, src, dst, v):
    """`dst(v)` with an fp8 side, through f32, by the target's cvt where it has one
    (`cvt.rn.f16x2.e4m3x2`, `cvt.rn.satfinite.e4m3x2.f32` on sm_89+), else ops' IR codecs."""
    target = fl.ctx.target
    if src.is_fp8:
        decoded = target.lower_intrinsic("fp8_decode", fl, v, src.name)
        v, src = (decoded if decoded is not None else fp8.decode(fl.b, v, src.name)), f32
    if not dst.is_fp8:
        return ops.cast(fl.b, src, dst, v)
    x = ops.cast(fl.b, src, f32, v)
    code = target.lower_intrinsic("fp8_encode", fl, x, dst.name)
    return code if code is not None else fp8.encode(fl.b, fl.ctx.module, x, dst.name)


def lower_minmax(fl, node, is_max):
    from .expressions import unify
    if node.keywords or len(node.args) < 2:
        raise fl.error(node, f"{'max' if is_max else 'min'}() takes two or more arguments")
    acc = fl.expr(node.args[0])
    for arg in node.args[1:]:
        other = fl.expr(arg)
        if isinstance(acc, ConstValue) and isinstance(other, ConstValue):
            acc = ConstValue((max if is_max else min)(acc.value, other.value))
            continue
        x, y, ty = unify(fl, acc, other, node)
        acc = Value(ty, minmax_ir(fl, ty, x.ir, y.ir, is_max))
    return acc


def minmax_ir(fl, ty, x, y, is_max):
    b = fl.b
    if ty.is_float or ops.is_packed(ty):
        half = ty.elem if ops.is_packed(ty) else ty
        native = ops.is_half(half) and fl.ctx.target.half_native(half, "max" if is_max else "min")
        return ops.float_minmax(b, ty, x, y, is_max, fl.ctx.intrinsic_decl, native)
    cmp = (b.icmp_signed if ty.is_signed else b.icmp_unsigned)(">" if is_max else "<", x, y)
    return b.select(cmp, x, y)


def lower_abs(fl, node):
    (val,) = positional(fl, node, 1, "abs()")
    if isinstance(val, ConstValue):
        return ConstValue(abs(val.value))
    if not isinstance(val, Value):
        raise fl.error(node, f"abs() of {describe(val)}")
    b = fl.b
    if val.ty.is_float or ops.is_packed(val.ty):
        return Value(val.ty, ops.fabs(b, val.ty, val.ir, fl.ctx.intrinsic_decl))
    if not val.ty.is_signed:
        return val
    neg = b.icmp_signed("<", val.ir, ir.Constant(val.ty.llvm, 0))
    return Value(val.ty, b.select(neg, b.neg(val.ir), val.ir))
