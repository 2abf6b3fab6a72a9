"""Values the lowering manipulates: typed LLVM values, compile-time constants, pointers,
fixed arrays, n-d array parameters and tuples."""
from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from ..types import ArrayPtrType, ArrayType, PtrType, ScalarType, TensorMapType


@dataclass
class Value:
    """A runtime scalar: DSL type + LLVM value (bool is i1)."""
    ty: ScalarType
    ir: ir.Value


@dataclass
class ConstValue:
    """A compile-time Python value (literal, Const parameter, folded expression). Literals adapt
    to the type of the other operand."""
    value: object


@dataclass
class PtrValue:
    ty: PtrType
    ir: ir.Value
    origin: object = None     # param index (CPU bounds checks) or None


@dataclass
class ArrayValue:
    """A shared/local fixed-shape array: base pointer + ArrayType."""
    ty: ArrayType
    ir: ir.Value              # pointer to the first element
    origin: object = None


@dataclass
class NdArrayValue:
    """An n-d array parameter (`pk.Array[f32, 2]`): data pointer + i64 extents and strides
    (in elements), as loaded from the kernel's parameters."""
    ty: ArrayPtrType
    ir: ir.Value              # pointer to element (0, ..., 0)
    shape: tuple              # rank i64 IR values
    strides: tuple            # rank i64 IR values, in elements (may be 0 or negative)
    name: str                 # the parameter's name, for bounds-check messages
    origin: object = None     # ("param", k): the CPU target checks the view's memory span


@dataclass
class TensorMapValue:
    """A `pk.TensorMap` parameter: the address of its 128 bytes (the NVPTX target: a
    grid-constant parameter; the CPU target: its place in the argument buffer)."""
    ty: TensorMapType
    ir: ir.Value
    name: str


@dataclass
class TupleValue:
    items: tuple


@dataclass
class TypeValue:
    """A DSL type used as a value (casts `f32(x)`, `pk.shared_array(T, N)`, dtype generics)."""
    ty: ScalarType


@dataclass
class GlobalRef:
    """A Python object (module, function, intrinsic) named in kernel source."""
    obj: object


def describe(val) -> str:
    """How error messages name a value: `f32`, `constant 3`, `shared array f32[64]`..."""
    if isinstance(val, Value):
        return str(val.ty)
    if isinstance(val, PtrValue):
        return str(val.ty)
    if isinstance(val, ConstValue):
        return f"constant {val.value!r}"
    if isinstance(val, TupleValue):
        return f"tuple of {len(val.items)}"
    if isinstance(val, ArrayValue):
        return f"{val.ty.space} array {val.ty.elem}{list(val.ty.shape)}"
    if isinstance(val, NdArrayValue):
        return f"array parameter {val.ty}"
    if isinstance(val, TypeValue):
        return f"type {val.ty}"
    if isinstance(val, TensorMapValue):
        return f"tensor map parameter '{val.name}'"
    if isinstance(val, GlobalRef):
        return f"Python object {val.obj!r}"
    return type(val).__name__
