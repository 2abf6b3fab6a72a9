"""Rounding to odd in LLVM IR, for the emulated f16/bf16 fma of lower/ops.py (float_fma).

Input: f64 operands of x*y+z whose product is exact in f64 (half-precision inputs: 11 or 8
bits each). Output: the f32 of the sum rounded to odd, which the caller rounds once more to
the half type: rounding to odd with at least two more bits than the last rounding makes the
two roundings one correct rounding.
"""
from __future__ import annotations

from llvmlite import ir

F32 = ir.FloatType()
F64 = ir.DoubleType()
I32 = ir.IntType(32)
I64 = ir.IntType(64)


def fma_f64_to_odd_f32(b: ir.IRBuilder, x, y, z, decl):
    """x*y+z (f64 values, x*y exact) as an f32 rounded to odd: the sum is rounded to odd in
    f64 (TwoSum gives its exact error), then to odd in f32. decl(name, type) declares an
    LLVM intrinsic."""
    product = b.fmul(x, y)
    total = b.fadd(product, z)
    moved = b.fsub(total, product)
    error = b.fadd(b.fsub(product, b.fsub(total, moved)), b.fsub(z, moved))
    odd = _to_odd(b, total, error, I64)
    return _round_to_odd_f32(b, odd, decl)


def _to_odd(b: ir.IRBuilder, near, error, int_ty):
    """`near` rounded to odd given the exact `error` of its rounding (true = near + error):
    truncated toward zero (one step down in magnitude if it was rounded up), lowest bit set."""
    zero = ir.Constant(near.type, 0.0)
    inexact = b.fcmp_ordered("one", error, zero)
    rounded_up = b.icmp_unsigned("!=", b.fcmp_ordered("<", error, zero),
                                 b.fcmp_ordered("<", near, zero))
    bits = b.bitcast(near, int_ty)
    toward_zero = b.select(rounded_up, b.sub(bits, ir.Constant(int_ty, 1)), bits)
    odd = b.or_(toward_zero, ir.Constant(int_ty, 1))
    return b.bitcast(b.select(inexact, odd, bits), near.type)


def _round_to_odd_f32(b: ir.IRBuilder, v, decl):
    """An f64 as f32 rounded to odd (NaN and infinities as they are)."""
    near = b.fptrunc(v, F32)
    back = b.fpext(near, F64)
    finite = b.fcmp_ordered("one", b.call(decl("llvm.fabs", F64), [v]),
                            ir.Constant(F64, float("inf")))
    error = b.select(finite, b.fsub(v, back), ir.Constant(F64, 0.0))
    return _to_odd(b, near, _error_sign_f32(b, error), I32)


def _error_sign_f32(b: ir.IRBuilder, error):
    """The sign and non-zeroness of an f64 rounding error as an f32 (+-1 or 0): the error
    itself may be below f32's range."""
    zero = ir.Constant(F64, 0.0)
    sign = b.select(b.fcmp_ordered("<", error, zero), ir.Constant(F32, -1.0),
                    ir.Constant(F32, 1.0))
    return b.select(b.fcmp_ordered("one", error, zero), sign, ir.Constant(F32, 0.0))
