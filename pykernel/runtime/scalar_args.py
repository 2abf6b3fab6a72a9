"""Scalar runtime parameters: their dtype names, struct codes and DSL spellings, and the
conversions and checks the packer's generated code calls for them.

Input: a parameter (.name, .dtype, .size) and, per launch, the Python value given for it.
Output: `scalar_format(param)` (its struct code), `converter(packer, param)` for the kinds
struct cannot pack as given (bool, bf16), `check_scalar(packer, param, value)` raising the
precise LaunchError for a value struct refused; `dtype_name`, `type_label` and
`f32_to_bf16_bits` for the rest of the runtime.
"""
from __future__ import annotations

import struct

import numpy as np

from ..errors import LaunchError

FORMAT = {"int8": "b", "uint8": "B", "int16": "h", "uint16": "H", "int32": "i",
           "uint32": "I", "int64": "q", "uint64": "Q", "float16": "e", "float32": "f",
           "float64": "d", "bool": "B", "bfloat16": "H"}
_DSL_NAME = {"int8": "i8", "uint8": "u8", "int16": "i16", "uint16": "u16", "int32": "i32",
             "uint32": "u32", "int64": "i64", "uint64": "u64", "float16": "f16",
             "float32": "f32", "float64": "f64", "bool": "bool_", "bfloat16": "bf16"}


def dtype_name(dtype) -> str:
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name


def type_label(param) -> str:
    if getattr(param, "type_name", None):  # the compiler's spelling, e.g. 'Ptr[f32, "ro"]'
        return param.type_name
    dsl = _DSL_NAME.get(dtype_name(param.dtype), dtype_name(param.dtype))
    return f"Ptr[{dsl}]" if param.kind == "ptr" else dsl


def f32_to_bf16_bits(value: float) -> int:
    """Round an f32 to bf16 (round to nearest, ties to even; NaN stays a quiet NaN)."""
    bits = struct.unpack("=I", struct.pack("=f", value))[0]
    if (bits & 0x7F800000) == 0x7F800000 and bits & 0x007FFFFF:
        return (bits >> 16) | 0x0040
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def scalar_format(param) -> str:
    """The parameter's struct code (its ABI size wins: a bool passed as a 4-byte int)."""
    name = dtype_name(param.dtype)
    fmt = FORMAT.get(name)
    if fmt is None:
        raise LaunchError(f"parameter '{param.name}': unsupported scalar dtype {name}")
    if struct.calcsize("=" + fmt) != param.size:  # e.g. bool passed as a 4-byte int
        fmt = {1: "B", 2: "H", 4: "I", 8: "Q"}[param.size]
    return fmt


def check_scalar(packer, param, value):
    """Raise the precise LaunchError for a scalar that struct refused."""
    name = dtype_name(param.dtype)
    label = type_label(param)
    if name in ("float16", "float32", "float64", "bfloat16"):
        if not isinstance(value, (int, float, np.integer, np.floating)) or \
                isinstance(value, bool):
            raise packer.error(param, f"a float ({label})", value)
        try:
            struct.pack("=" + FORMAT[name], value)
        except (OverflowError, struct.error):
            raise packer.error(param, f"a float that fits {label}", value) from None
        return
    if not isinstance(value, (int, np.integer)):
        raise packer.error(param, f"an integer ({label})", value)
    info = np.iinfo(np.dtype(name)) if name != "bool" else None
    if info is not None and not info.min <= int(value) <= info.max:
        raise packer.error(param, f"an integer in [{info.min}, {info.max}] ({label})", value)


def converter(packer, param):
    """value -> the field's integer, for bool (0 or 1 only) and bf16 (rounded from f32)."""
    if dtype_name(param.dtype) == "bool":
        def to_bool(value):
            if isinstance(value, (bool, np.bool_)) or (
                    isinstance(value, (int, np.integer)) and value in (0, 1)):
                return int(value)
            raise packer.error(param, "a bool (bool_)", value)
        return to_bool

    def to_bf16(value):
        if isinstance(value, (int, float, np.integer, np.floating)) and \
                not isinstance(value, bool):
            try:
                return f32_to_bf16_bits(float(value))
            except OverflowError:
                pass
        raise packer.error(param, "a float that fits bf16 (via f32)", value)
    return to_bf16
