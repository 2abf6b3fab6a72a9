"""8-bit floats (e4m3, e5m2) as u8 codes, with the hardware's conversions.

    pk.fp8_encode(x, "e4m3")    f32 / f16 -> u8 code, `cvt.rn.satfinite.e4m3x2.f32` (sm_89+):
                                nearest even, overflow and infinities saturate to the largest
                                finite value (448, 57344), NaN -> 0x7F | sign
    pk.fp8_decode(code, "e5m2") u8 code -> f32 (exact), `cvt.rn.f16x2.e5m2x2` (sm_89+)

Other targets (the CPU, sm_75..sm_86) compute the same bits in IR (lower/fp8.py). Arrays of
fp8 values are u8 arrays; pykernel.fp8 has the numpy encode / decode on the host."""
from __future__ import annotations

from ..lower import fp8 as fp8_ir
from ..lower import ops
from ..lower.values import ConstValue, Value, describe
from ..types import f32, u8
from .base import args_of, intrinsic


def _format(fl, node, val, name):
    if not isinstance(val, ConstValue) or val.value not in fp8_ir.FORMATS:
        raise fl.error(node.args[1], f"pk.{name}: the format must be 'e4m3' or 'e5m2', got "
                       f"{describe(val)}")
    return val.value


@intrinsic("fp8_encode")
def fp8_encode(fl, node):
    """`pk.fp8_encode(x, fmt)`: f32 / f16 / bf16 -> the u8 code (module docstring)."""
    (x, fmt), _ = args_of(fl, node, 2, "fp8_encode")
    fmt = _format(fl, node, fmt, "fp8_encode")
    x = fl.materialize(x, node)
    if not isinstance(x, Value) or not x.ty.is_float or x.ty.bits > 32:
        raise fl.error(node.args[0], f"pk.fp8_encode converts f32, f16 or bf16, got "
                       f"{describe(x)}")
    value = ops.to_f32(fl.b, x.ty, x.ir)
    code = fl.ctx.target.lower_intrinsic("fp8_encode", fl, value, fmt)
    if code is None:
        code = fp8_ir.encode(fl.b, fl.ctx.module, value, fmt)
    return Value(u8, code)


@intrinsic("fp8_decode")
def fp8_decode(fl, node):
    """`pk.fp8_decode(code, fmt)`: the u8 code -> f32 (exact)."""
    (code, fmt), _ = args_of(fl, node, 2, "fp8_decode")
    fmt = _format(fl, node, fmt, "fp8_decode")
    code = fl.coerce(code, u8, node.args[0])
    value = fl.ctx.target.lower_intrinsic("fp8_decode", fl, code.ir, fmt)
    if value is None:
        value = fp8_ir.decode(fl.b, code.ir, fmt)
    return Value(f32, value)

