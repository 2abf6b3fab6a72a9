"""`print(...)` in kernels and device functions: Python's own `print` for debugging, lowered to
one formatted write per thread (`vprintf` on the GPU, C `printf` on the CPU target).

Constant arguments (strings, numbers) become literal text of the format; runtime scalars are
widened (integers to 64 bits, floats to f64) and printed with `%lld` / `%llu` / `%g`, bools as
True / False; `sep=` and `end=` take constant strings as in Python."""
from __future__ import annotations

import builtins

from llvmlite import ir

from ..types import f64, i64, u64
from . import ops
from .codegen import describe
from .values import ConstValue, Value


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
        val = fl.expr(arg)
        if isinstance(val, ConstValue) and isinstance(val.value, (str, bool, int, float)):
            pieces.append(_escape(builtins.str(val.value)))
            continue
        if not isinstance(val, Value):
            raise fl.error(arg, f"cannot print {describe(val)} in a kernel",
                           hint="print scalars: an element p[i], a loop index, a value")
        spec, widened = _format_of(fl, val)
        pieces.append(spec)
        values.append(widened)
    pieces.append(_escape(seps["end"]))
    fl.ctx.uses.add("print")
    fl.ctx.target.device_print(fl.ctx, "".join(pieces), values)
    return ConstValue(None)


def _escape(text: str) -> str:
    return text.replace("%", "%%")


def _format_of(fl, val: Value) -> tuple[str, ir.Value]:
    b = fl.b
    if val.ty.name == "bool_":      # the text True / False, chosen at run time
        return "%s", ("bool", val.ir)
    if val.ty.is_float:
        return "%g", ops.cast(b, val.ty, f64, val.ir)
    if val.ty.is_signed:
        return "%lld", ops.cast(b, val.ty, i64, val.ir)
    return "%llu", ops.cast(b, val.ty, u64, val.ir)
