"""`pk.exp exp2 log log2 tanh erf sin cos` (accurate, implemented in pykernel: mathlib.py),
`pk.sqrt rsqrt floor ceil fma` (one instruction each: basic_math.py) and `pk.fast.*`, the
`.approx` PTX instructions (ex2.approx, lg2.approx, rsqrt.approx, sin/cos.approx,
tanh.approx: targets/nvptx_intrinsics.py). A target without them (the CPU target) computes the
accurate functions."""
from __future__ import annotations

import ast

from .. import mathlib
from ..lower import ops
from ..lower.functions import inline_call
from ..lower.values import Value
from ..types import f32
from .base import intrinsic
from .basic_math import ceil, float_args, floor, fma, rint, rsqrt, sqrt, trunc

__all__ = ["ceil", "floor", "fma", "rint", "rsqrt", "sqrt", "trunc", "exp", "exp2", "log",
           "log2", "tanh", "erf", "sin", "cos", "fast"]


def call_f32(fl, node, dfunc, x: Value) -> Value:
    """Inline an f32 mathlib function on x (f16/bf16 computed in f32 and rounded back)."""
    xv = Value(f32, ops.cast(fl.b, x.ty, f32, x.ir))
    holder = f"__pk_math_arg{len(fl.ctx.sites)}_{id(node)}"
    fl.vars[holder] = xv
    call = ast.Call(func=ast.Name(id="__fn__", ctx=ast.Load()),
                    args=[ast.Name(id=holder, ctx=ast.Load())], keywords=[])
    ast.copy_location(call, node)
    for sub in ast.walk(call):
        ast.copy_location(sub, node)
    r = inline_call(fl, dfunc, call)
    fl.vars.pop(holder, None)
    return Value(x.ty, ops.cast(fl.b, f32, x.ty, r.ir))


def no_f64(fl, node, name):
    """The transcendental functions have no f64 form on any target: PTX has no f64 exp/log/
    sin instructions, pykernel ships no libdevice, and mathlib.py is written for f32."""
    return fl.error(node, f"pk.{name} has no f64 form (f32, f16 and bf16 only): pykernel has "
                    "no libdevice and its math library is f32", hint=f"convert: pk.{name}(f32(x))")


def accurate(name):
    dfunc = getattr(mathlib, name)

    def lower(fl, node):
        (x,), ty = float_args(fl, node, name, 1)
        if ty.bits == 64:
            raise no_f64(fl, node, name)
        return call_f32(fl, node, dfunc, x)
    lower.__doc__ = f"Accurate {name} (see mathlib.py for the error bound)."
    return intrinsic(name)(lower)


exp, exp2, log, log2 = accurate("exp"), accurate("exp2"), accurate("log"), accurate("log2")
tanh, erf, sin, cos = accurate("tanh"), accurate("erf"), accurate("sin"), accurate("cos")

ACCURATE = {"exp2": exp2, "exp": exp, "log2": log2, "log": log, "rsqrt": rsqrt, "sqrt": sqrt,
            "sin": sin, "cos": cos, "tanh": tanh}


def fast_fn(name):
    def lower(fl, node):
        if not fl.ctx.target.has_intrinsic("fast_math"):    # no .approx form: the accurate one
            return ACCURATE[name].lower_call(fl, node)
        (x,), ty = float_args(fl, node, f"fast.{name}", 1)
        if ty.bits == 64:   # never demoted to f32: the accurate f64 forms, or an error
            if name in ("sqrt", "rsqrt"):   # sqrt.rn.f64 (and div.rn.f64)
                r = fl.b.call(fl.ctx.intrinsic_decl("llvm.sqrt", ty.llvm), [x.ir])
                return Value(ty, r if name == "sqrt" else fl.b.fdiv(ops.const_ir(ty, 1.0), r))
            raise no_f64(fl, node, f"fast.{name}")
        return Value(ty, fl.ctx.target.lower_intrinsic("fast_math", fl, name, ty, x))
    lower.__doc__ = (f"Approximate {name}: the GPU's `.approx` instruction (accurate version on "
                     "the CPU target).")
    return intrinsic(f"fast.{name}")(lower)


class FastMath:
    """`pk.fast.exp2(x)` etc.: the PTX `.approx` instructions."""

    def __init__(self):
        for name in ACCURATE:
            setattr(self, name, fast_fn(name))

    def __repr__(self):
        return "pk.fast"


fast = FastMath()
