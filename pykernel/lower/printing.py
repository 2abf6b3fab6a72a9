"""`print(...)` in kernels and device functions: Python's own `print` for debugging, lowered to
one formatted write per thread (`vprintf` on the GPU, C `printf` on the CPU target).

Constant arguments (strings, numbers) become literal text of the format; runtime scalars are
widened (integers to 64 bits, floats to f64) and printed with `%lld` / `%llu` / `%g`, bools as
True / False; `sep=` and `end=` take constant strings as in Python. f-strings work inside
print: `{x:8.3f}`, `{i:04d}`, `{k:x}`: the subset of the format-spec mini-language that
printf can express ([<>][+ ][0][width][.precision][d x X o f e g])."""
from __future__ import annotations

import ast
import re

from llvmlite import ir

from ..types import f64, i64, u64
from . import ops
from .values import ConstValue, Value, describe


def lower_print(fl, node):
    seps = {"sep": " ", "end": "\n"}
    for kw in node.keywords:
        if kw.arg not in seps:
            raise fl.error(kw, f"print() in a kernel takes sep= and end= only, not {kw.arg}=",
                           hint="device output always goes to the process's stdout")
        value = fl.expr(kw.value)
        if not (isinstance(value, ConstValue) and isinstance(value.value, (str, type(None)))):
            raise fl.error(kw.value, f"print()'s {kw.arg}= must be a constant string")
        if value.value is not None:
            seps[kw.arg] = value.value
    pieces, values = [], []
    for k, arg in enumerate(node.args):
        if k:
            pieces.append(_escape(seps["sep"]))
        parts = arg.values if isinstance(arg, ast.JoinedStr) else [arg]
        for part in parts:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                pieces.append(_escape(part.value))
            elif isinstance(part, ast.FormattedValue):
                if part.conversion != -1:
                    raise fl.error(part, "!r / !s / !a conversions are not supported in a "
                                   "kernel print")
                _piece(fl, part.value, _format_spec(fl, part), pieces, values)
            else:
                _piece(fl, part, "", pieces, values)
    pieces.append(_escape(seps["end"]))
    fl.ctx.uses.add("print")
    fl.ctx.target.device_print(fl.ctx, "".join(pieces), values)
    return ConstValue(None)


def _bool_text(fl, cond):
    target, ctx = fl.ctx.target, fl.ctx
    return fl.b.select(cond, target.print_string(ctx, "True"), target.print_string(ctx, "False"))


# the part of Python's format-spec mini-language that printf can say
SPEC = re.compile(r"(?P<align>[<>])?(?P<sign>[+ ])?(?P<zero>0)?(?P<width>\d+)?"
                  r"(?:\.(?P<prec>\d+))?(?P<type>[dxXofFeEgG]?)")


def _format_spec(fl, part) -> str:
    spec = part.format_spec
    if spec is None:
        return ""
    if not all(isinstance(v, ast.Constant) for v in spec.values):
        raise fl.error(spec, "a kernel print's format spec must be constant")
    return "".join(v.value for v in spec.values)


def _piece(fl, arg, spec: str, pieces: list, values: list) -> None:
    val = fl.expr(arg)
    if isinstance(val, ConstValue) and isinstance(val.value, (str, bool, int, float)):
        try:
            pieces.append(_escape(format(val.value, spec)))
        except ValueError as exc:
            raise fl.error(arg, f"cannot format {val.value!r} with {spec!r}: {exc}") from None
        return
    if not isinstance(val, Value):
        raise fl.error(arg, f"cannot print {describe(val)} in a kernel",
                       hint="print scalars: an element p[i], a loop index, a value")
    match = SPEC.fullmatch(spec)
    if match is None:
        raise fl.error(arg, f"format spec {spec!r} is not supported in a kernel print",
                       hint="[<>][+ ][0][width][.precision][d x X o f e g]")
    printf_spec, widened = _format_of(fl, arg, val, match)
    pieces.append(printf_spec)
    values.append(widened)


def _escape(text: str) -> str:
    return text.replace("%", "%%")


def _format_of(fl, arg, val: Value, spec: re.Match) -> tuple[str, ir.Value]:
    """The printf conversion for a runtime scalar under a (parsed) format spec, and the value
    widened to what that conversion reads."""
    b = fl.b
    kind = spec["type"]
    flags = ("-" if spec["align"] == "<" else "") + (spec["sign"] or "") + (spec["zero"] or "")
    head = "%" + flags + (spec["width"] or "") + (f".{spec['prec']}" if spec["prec"] else "")
    if val.ty.name == "bool_":      # the text True / False, chosen at run time
        if spec.group(0):
            raise fl.error(arg, "a bool prints as True / False: no format spec")
        return "%s", _bool_text(fl, val.ir)
    if val.ty.is_float or val.ty.is_fp8 or (kind and kind in "fFeEgG"):
        if kind and kind in "dxXo":
            raise fl.error(arg, f"format type {kind!r} needs an integer, got {val.ty}")
        return head + (kind or "g"), ops.cast(b, val.ty, f64, val.ir)
    if spec["prec"]:
        raise fl.error(arg, "an integer takes no precision (Python: 'Precision not allowed')")
    if kind and kind in "xXo":
        return head + "ll" + kind, ops.cast(b, val.ty, u64 if not val.ty.is_signed else i64,
                                            val.ir)
    if val.ty.is_signed:
        return head + "lld", ops.cast(b, val.ty, i64, val.ir)
    return head + "llu", ops.cast(b, val.ty, u64, val.ir)
