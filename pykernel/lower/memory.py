"""Memory access: `p[i]` on global pointers, `a[i]` / `a[i, j]` on shared and local arrays,
`x[i, j]` on n-d array parameters (ndarray.py),
loads and stores through the target (which adds ld.global.nc for read-only pointers and bounds
checks where asked)."""
from __future__ import annotations

import ast

from llvmlite import ir

from ..types import ScalarType, bool_
from . import ndarray, ops
from .values import ArrayValue, NdArrayValue, PtrValue, Value, describe

I64 = ir.IntType(64)


class Address:
    def __init__(self, ptr, elem: ScalarType, readonly: bool, origin, node):
        self.ptr, self.elem, self.readonly = ptr, elem, readonly
        self.origin, self.node = origin, node


def _index(fl, node, base):
    if isinstance(base, PtrValue):
        idx = fl.materialize(fl.expr(node.slice), node.slice)
        if not isinstance(idx, Value) or not idx.ty.is_int:
            raise fl.error(node.slice, f"index must be an integer, got {describe(idx)}")
        off = ops.index_to_i64(fl.b, idx.ty, idx.ir)
        return Address(fl.b.gep(base.ir, [off]), base.ty.elem, base.ty.readonly, base.origin,
                       node)
    if isinstance(base, NdArrayValue):
        return Address(ndarray.element_pointer(fl, node, base), base.ty.elem, base.ty.readonly,
                       base.origin, node)
    if isinstance(base, ArrayValue):
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        shape = base.ty.shape
        if len(parts) != len(shape):
            raise fl.error(node.slice, f"array of {len(shape)} dimensions indexed with "
                           f"{len(parts)} indices")
        flat = None
        for part, extent in zip(parts, shape):
            idx = fl.materialize(fl.expr(part), part)
            if not isinstance(idx, Value) or not idx.ty.is_int:
                raise fl.error(part, f"index must be an integer, got {describe(idx)}")
            i = ops.index_to_i64(fl.b, idx.ty, idx.ir)
            flat = i if flat is None else fl.b.add(fl.b.mul(flat, ir.Constant(I64, extent)), i)
        return Address(fl.b.gep(base.ir, [flat]), base.ty.elem, False, base.origin, node)
    raise fl.error(node.value, f"{describe(base)} cannot be indexed")


def subscript_address(fl, node: ast.Subscript, base=None) -> Address:
    if base is None:
        base = fl.expr(node.value)
    return _index(fl, node, base)


def load_subscript(fl, node, addr: Address | None = None, base=None):
    if addr is None:
        addr = subscript_address(fl, node, base)
    return load(fl, addr)


def load(fl, addr: Address):
    site = fl.ctx.site(fl, addr.node, "out-of-bounds read")
    ptr = fl.ctx.target.check_address(fl.ctx, addr.ptr, addr.elem, addr.origin, site)
    raw = fl.ctx.target.load(fl.ctx, ptr, addr.elem, addr.readonly)
    if addr.elem is bool_:
        raw = fl.b.trunc(raw, ir.IntType(1))
    return Value(addr.elem, raw)


def store_subscript(fl, node, val, addr: Address | None = None):
    if addr is None:
        addr = subscript_address(fl, node)
    if addr.readonly:
        raise fl.error(node, "cannot store through a read-only pointer (Ptr[..., \"ro\"] or "
                       "pk.Array[..., \"ro\"])")
    val = fl.coerce(val, addr.elem, node)
    store(fl, addr, val.ir)


def store(fl, addr: Address, raw):
    if addr.elem is bool_:
        raw = fl.b.zext(raw, ir.IntType(8))
    site = fl.ctx.site(fl, addr.node, "out-of-bounds write")
    ptr = fl.ctx.target.check_address(fl.ctx, addr.ptr, addr.elem, addr.origin, site)
    fl.ctx.target.store(fl.ctx, ptr, raw, addr.elem)


def element_pointer(fl, node, base_node, index_node) -> Address:
    """`(ptr, index)` argument pairs of intrinsics (atomics, vector loads)."""
    base = fl.expr(base_node)
    fake = ast.Subscript(value=base_node, slice=index_node, ctx=ast.Load())
    ast.copy_location(fake, node)
    fake.end_lineno, fake.end_col_offset = node.end_lineno, node.end_col_offset
    return _index(fl, fake, base)
