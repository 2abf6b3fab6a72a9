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


# How error messages name a value, by its class: `f32`, `constant 3`, `shared array f32[64]`...
_DESCRIPTIONS = (
    ((Value, PtrValue), lambda v: str(v.ty)),
    (ConstValue, lambda v: f"constant {v.value!r}"),
    (TupleValue, lambda v: f"tuple of {len(v.items)}"),
    (ArrayValue, lambda v: f"{v.ty.space} array {v.ty.elem}{list(v.ty.shape)}"),
    (NdArrayValue, lambda v: f"array parameter {v.ty}"),
    (TypeValue, lambda v: f"type {v.ty}"),
    (TensorMapValue, lambda v: f"tensor map parameter '{v.name}'"),
    (GlobalRef, lambda v: f"Python object {v.obj!r}"),
)


def describe(val) -> str:
    """How error messages name a value (_DESCRIPTIONS); anything else by its class name."""
    for classes, text in _DESCRIPTIONS:
        if isinstance(val, classes):
            return text(val)
    return type(val).__name__
