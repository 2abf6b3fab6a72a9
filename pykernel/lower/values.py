"""Values the lowering manipulates: typed LLVM values, compile-time constants, pointers,
fixed arrays and tuples."""
from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from ..types import ArrayType, PtrType, ScalarType


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
