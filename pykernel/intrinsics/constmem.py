"""Constant memory: small read-only tables made at import time and read by kernels.

`TABLE = pk.const_array(values, dtype)` at module level; in a kernel `TABLE[i]` loads element i
from the `.const` state space on the GPU (`ld.const.f32`: cached, fastest when a warp reads one
address) and from a read-only global on the CPU target. The table's contents are part of the
kernel's cache key (`cache_token`), so changing it recompiles."""
from __future__ import annotations

import hashlib

import numpy as np
from llvmlite import ir

from ..lower import ops
from ..lower.values import PtrValue
from ..types import PtrType, ScalarType, bf16, from_numpy

# CUDA's constant bank for user data is 64 KiB per module
CONST_BYTES_LIMIT = 64 * 1024


class ConstArray:
    """A 1-D table of one scalar type, in constant memory when a kernel reads it."""

    def __init__(self, values, dtype=None):
        self.elem = _element_type(values, dtype)
        data = np.asarray(values)
        if data.ndim != 1 or data.size == 0:
            raise ValueError(f"pk.const_array takes a non-empty 1-D sequence, got shape "
                             f"{data.shape}")
        self.values = _to_storage(data, self.elem)
        self.values.setflags(write=False)
        if self.values.nbytes > CONST_BYTES_LIMIT:
            raise ValueError(f"pk.const_array: {self.values.nbytes} bytes; constant memory "
                             f"holds at most {CONST_BYTES_LIMIT} bytes")

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        return f"pk.const_array({len(self)} x {self.elem})"

    def cache_token(self) -> str:
        """What a kernel compiled against this table depends on: type and bytes."""
        return f"{self.elem}:{hashlib.sha256(self.values.tobytes()).hexdigest()}"

    def lower_global(self, fl, node):
        """In a kernel: a read-only pointer to the table (one global per compiled module)."""
        tables = fl.ctx.target_data.setdefault("const_arrays", {})
        gv = tables.get(id(self))
        if gv is None:
            storage = self.elem.storage
            init = ir.Constant(ir.ArrayType(storage, len(self)),
                               [_constant(storage, self.elem, v) for v in self.values])
            gv = tables[id(self)] = fl.ctx.target.constant_table(fl.ctx, init)
        zero = ir.Constant(ir.IntType(32), 0)
        ptr = gv.gep([zero, zero])
        return PtrValue(PtrType(self.elem, readonly=True, space="const"), ptr,
                        ("array", ptr, self.values.nbytes))


def const_array(values, dtype=None) -> ConstArray:
    """`pk.const_array([1.0, 0.5, 0.25], pk.f32)`: a constant-memory table for kernels (made
    outside kernels, typically at module level). dtype: a pykernel or numpy scalar type;
    by default the values' numpy dtype."""
    return ConstArray(values, dtype)


def _element_type(values, dtype) -> ScalarType:
    if dtype is None:
        dtype = np.asarray(values).dtype
    try:
        return from_numpy(dtype)
    except TypeError:
        raise TypeError(f"pk.const_array: no pykernel scalar type for {dtype!r}") from None


def _to_storage(data: np.ndarray, elem: ScalarType) -> np.ndarray:
    """The values as their stored bits: numpy's conversion, bf16 rounded to nearest even."""
    if elem is bf16:
        wide = np.ascontiguousarray(data, np.float32).view(np.uint32).astype(np.uint64)
        nan = np.isnan(data.astype(np.float32))
        bits = ((wide + 0x7FFF + ((wide >> 16) & 1)) >> 16).astype(np.uint16)
        return np.where(nan, np.uint16(0x7FC0), bits)
    if elem.kind == "bool":
        return data.astype(np.uint8)
    return data.astype(elem.np_dtype)


def _constant(storage: ir.Type, elem: ScalarType, value) -> ir.Constant:
    if elem is bf16 or elem.kind == "bool":
        return ir.Constant(storage, int(value))
    if elem.is_float:
        return ir.Constant(storage, float(value))
    return ops.const_ir(elem, int(value))
