"""The one type table: DSL scalar types -> llvmlite type, numpy dtype, PTX suffix; plus the
annotation markers `Ptr[T]`, `Const[...]`, `ReadOnly[...]`, the n-d array parameter
`pk.Array[T, rank]` (ArrayAnnotation -> ArrayPtrType), the dtype generic `pk.dtype` and the
tensor-map parameter `pk.TensorMap`."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from .errors import annotation_error


@dataclass(frozen=True)
class ScalarType:
    name: str
    bits: int
    kind: str            # "int" | "uint" | "float" | "bool" | "fp8"
    ptx: str             # PTX register suffix: s32, u32, f32, ...
    np_name: str         # numpy dtype name ("bfloat16" has no numpy dtype)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_signed(self) -> bool:
        return self.kind == "int"

    @property
    def is_fp8(self) -> bool:
        return self.kind == "fp8"

    @property
    def nbytes(self) -> int:
        return max(1, self.bits // 8)

    @property
    def llvm(self) -> ir.Type:
        if self.kind == "bool":
            return ir.IntType(1)
        if self.name == "bf16":       # llvmlite has no bfloat: bf16 lives as raw i16 bits
            return ir.IntType(16)
        if self.kind == "float":
            return {16: ir.HalfType(), 32: ir.FloatType(), 64: ir.DoubleType()}[self.bits]
        return ir.IntType(self.bits)

    @property
    def storage(self) -> ir.Type:
        """How the value sits in memory (bool is one byte)."""
        return ir.IntType(8) if self.kind == "bool" else self.llvm

    @property
    def np_dtype(self):
        return np.dtype(self.np_name) if self.np_name != "bfloat16" else "bfloat16"

    def __call__(self, value):  # outside kernels, f32(1.5) is the numpy conversion
        if self.np_name == "bfloat16":
            return float(value)
        return np.dtype(self.np_name).type(value)

    def __repr__(self) -> str:
        return self.name


bool_ = ScalarType("bool_", 1, "bool", "pred", "bool")
i8 = ScalarType("i8", 8, "int", "s8", "int8")
i16 = ScalarType("i16", 16, "int", "s16", "int16")
i32 = ScalarType("i32", 32, "int", "s32", "int32")
i64 = ScalarType("i64", 64, "int", "s64", "int64")
u8 = ScalarType("u8", 8, "uint", "u8", "uint8")
u16 = ScalarType("u16", 16, "uint", "u16", "uint16")
u32 = ScalarType("u32", 32, "uint", "u32", "uint32")
u64 = ScalarType("u64", 64, "uint", "u64", "uint64")
f16 = ScalarType("f16", 16, "float", "f16", "float16")
bf16 = ScalarType("bf16", 16, "float", "bf16", "bfloat16")
f32 = ScalarType("f32", 32, "float", "f32", "float32")
f64 = ScalarType("f64", 64, "float", "f64", "float64")


@dataclass(frozen=True, repr=False)
class FP8Type(ScalarType):
    """An 8-bit float (`pk.e4m3`, `pk.e5m2`): one byte in memory (its code; host arrays are
    uint8 arrays of codes, pykernel.fp8 has the codecs), no arithmetic of its own: `f32(v)`
    decodes exactly, `pk.e4m3(x)` encodes with `cvt.rn.satfinite` (lower/fp8.py). Outside
    kernels, `pk.e4m3(1.5)` is the host encoding (an np.uint8 code)."""

    @property
    def llvm(self) -> ir.Type:
        return ir.IntType(8)

    def __call__(self, value):
        from . import fp8
        return fp8.encode(np.float32(value), self.name)[()]


e4m3 = FP8Type("e4m3", 8, "fp8", "b8", "uint8")
e5m2 = FP8Type("e5m2", 8, "fp8", "b8", "uint8")


@dataclass(frozen=True, repr=False)
class PackedType(ScalarType):
    """Two f16 or two bf16 in one 32-bit register (`f16x2`, `bf16x2`): built by `f16x2(a, b)`,
    lanes read as `.x` / `.y` (or `[0]` / `[1]`), arithmetic on both lanes at once
    (`add.rn.f16x2`, `fma.rn.bf16x2`). In memory one 32-bit word, lane x in the low half
    (arrays of them are uint32 arrays, as bf16 arrays are uint16 ones)."""
    elem: ScalarType = None
    lanes: int = 2

    @property
    def llvm(self) -> ir.Type:
        return ir.VectorType(self.elem.llvm, self.lanes)   # <2 x half>; bf16: <2 x i16>

    def __call__(self, *values):
        raise TypeError(f"{self.name}(a, b) builds a packed pair inside kernels only")


f16x2 = PackedType("f16x2", 32, "packed", "b32", "uint32", elem=f16)
bf16x2 = PackedType("bf16x2", 32, "packed", "b32", "uint32", elem=bf16)

SCALARS = {t.name: t for t in (bool_, i8, i16, i32, i64, u8, u16, u32, u64, f16, bf16, f32, f64,
                               e4m3, e5m2)}
BY_NUMPY = {np.dtype(t.np_name): t for t in SCALARS.values()
            if t.np_name != "bfloat16" and not t.is_fp8}     # uint8 arrays are u8 by default


def from_numpy(dtype) -> ScalarType:
    if isinstance(dtype, ScalarType):
        return dtype
    if isinstance(dtype, str) and dtype in ("bfloat16", "bf16"):
        return bf16
    try:
        return BY_NUMPY[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise TypeError(f"no pykernel scalar type for numpy dtype {dtype!r}") from None


@dataclass(frozen=True)
class PtrType:
    elem: ScalarType
    readonly: bool = False
    space: str = "global"     # "global" | "shared" | "local"

    def __repr__(self) -> str:
        ro = ', "ro"' if self.readonly else ""
        return f"Ptr[{self.elem}{ro}]" if self.space == "global" else f"{self.space} {self.elem}*"


@dataclass(frozen=True)
class ArrayType:
    """A fixed-shape array in shared or local memory: `pk.shared_array(f32, (32, 33))`."""
    elem: ScalarType
    shape: tuple
    space: str                 # "shared" | "local"

    @property
    def count(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class _PtrMarker:
    """`Ptr[f32]`, `Ptr[f32, "ro"]`, `Ptr[T]` with T a type variable."""

    def __getitem__(self, item):
        if isinstance(item, tuple):
            elem, *flags = item
            unknown = [f for f in flags if f != "ro"]
            if unknown:
                raise annotation_error(f"unknown Ptr flag {unknown[0]!r} (only \"ro\")",
                                       hint='Ptr[f32] is read-write; Ptr[f32, "ro"] read-only')
            return PtrAnnotation(elem, readonly="ro" in flags)
        return PtrAnnotation(item, readonly=False)


@dataclass(frozen=True)
class PtrAnnotation:
    elem: object               # ScalarType, TypeVar name, or a Const dtype parameter name
    readonly: bool


@dataclass(frozen=True)
class ArrayPtrType(PtrType):
    """The data pointer of an n-d array parameter (`pk.Array[f32, 2]`): a global pointer whose
    kernel ABI is followed by `rank` i64 extents and `rank` i64 strides in elements."""
    rank: int = 1

    def __repr__(self) -> str:
        ro = ', "ro"' if self.readonly else ""
        return f"Array[{self.elem}, {self.rank}{ro}]"


@dataclass(frozen=True)
class ArrayAnnotation:
    """`pk.Array[f32, 2]`, `pk.Array[f32, 2, "ro"]`, `pk.Array[T, 3]` in a kernel signature."""
    elem: object               # ScalarType, TypeVar name, or a Const dtype parameter name
    rank: int
    readonly: bool = False


MAX_ARRAY_RANK = 8


def array_annotation(item) -> ArrayAnnotation:
    """`pk.Array[...]`'s subscript: (element type, rank[, "ro"])."""
    items = item if isinstance(item, tuple) else (item,)
    if len(items) < 2:
        raise annotation_error("pk.Array[...] takes an element type and a rank, e.g. "
                               "pk.Array[f32, 2]")
    elem, rank, *flags = items
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= MAX_ARRAY_RANK:
        raise annotation_error(f"pk.Array rank must be an int in 1..{MAX_ARRAY_RANK}, got "
                               f"{rank!r}")
    unknown = [f for f in flags if f != "ro"]
    if unknown:
        raise annotation_error(f"unknown pk.Array flag {unknown[0]!r} (only \"ro\")")
    return ArrayAnnotation(elem, rank, "ro" in flags)


class _ReadOnlyMarker:
    def __getitem__(self, item):
        if isinstance(item, PtrAnnotation):
            return PtrAnnotation(item.elem, readonly=True)
        if isinstance(item, ArrayAnnotation):
            return ArrayAnnotation(item.elem, item.rank, readonly=True)
        raise annotation_error("ReadOnly[...] wraps a Ptr[...] or pk.Array[...] annotation")


@dataclass(frozen=True)
class ConstAnnotation:
    kind: object               # int, float, bool, or DTYPE


class _ConstMarker:
    def __getitem__(self, item):
        return ConstAnnotation(item)


class _DTypeMarker:
    """`Const[pk.dtype]`: a compile-time element type; the kernel body is monomorphised."""

    def __repr__(self):
        return "pk.dtype"


@dataclass(frozen=True)
class TensorMapType:
    """`pk.TensorMap`: a TMA tensor map (CUtensorMap) passed by value, 128 bytes aligned to 64
    (`.param .align 64 .b8 name[128]`); built on the host by `pk.tensor_map`."""
    nbytes: int = 128
    align: int = 64

    def __repr__(self) -> str:
        return "TensorMap"


TensorMap = TensorMapType()
Ptr = _PtrMarker()
ReadOnly = _ReadOnlyMarker()
Const = _ConstMarker()
dtype = _DTypeMarker()

INT_RANGES = {t.name: ((-(1 << (t.bits - 1)), (1 << (t.bits - 1)) - 1) if t.is_signed
                       else (0, (1 << t.bits) - 1)) for t in SCALARS.values() if t.is_int}


def common_int_literal_type(value: int) -> ScalarType:
    return i32 if -(1 << 31) <= value < (1 << 31) else i64
