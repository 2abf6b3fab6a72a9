"""N-d array parameters (`pk.Array[f32, 2]`) in the lowering.

Input: the kernel's expanded parameters, where an array `x` of rank r is the data pointer
followed by r i64 extents and r i64 strides (in elements; signature.array_abi). Output: an
NdArrayValue bound to `x`; `x[i, j]` -> the element's address, the offset computed in i64
(sum of index * stride) so that no extent or product wraps at 2^31, each index checked
against its extent where the target checks (the CPU target always, NVPTX with bounds_check);
`x.shape`, `x.strides` (tuples of i64) and `x.ndim` (a compile-time int)."""
from __future__ import annotations

import ast

from llvmlite import ir

from ..types import ArrayPtrType, i64
from . import ops
from .values import ConstValue, NdArrayValue, TupleValue, Value, describe

ATTRIBUTES = ("shape", "strides", "ndim")


def is_array_extent(params, k: int) -> bool:
    """Whether parameter k is an extent or stride of an array parameter before it."""
    for j, (_, ty) in enumerate(params[:k]):
        if isinstance(ty, ArrayPtrType) and j < k <= j + 2 * ty.rank:
            return True
    return False


def bind_array_param(params, raw_args, k: int) -> NdArrayValue:
    """The NdArrayValue of array parameter k from its ABI slots k .. k + 2 * rank."""
    name, ty = params[k]
    rank = ty.rank
    shape = tuple(raw_args[k + 1:k + 1 + rank])
    strides = tuple(raw_args[k + 1 + rank:k + 1 + 2 * rank])
    return NdArrayValue(ty, raw_args[k], shape, strides, name, ("param", k))


def element_pointer(fl, node: ast.Subscript, base: NdArrayValue) -> ir.Value:
    """`x[i, j, ...]`: one integer index per dimension (any int type, widened to i64)."""
    parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    rank = base.ty.rank
    if len(parts) != rank:
        raise fl.error(node.slice, f"'{base.name}' is a {rank}-d array ({base.ty}) indexed "
                       f"with {len(parts)} ind{'ex' if len(parts) == 1 else 'ices'}",
                       hint=f"give one index per dimension, e.g. {base.name}"
                            f"[{', '.join('ijkl'[d % 4] for d in range(rank))}]")
    b, target = fl.b, fl.ctx.target
    offset = None
    for dim, part in enumerate(parts):
        idx = fl.materialize(fl.expr(part), part)
        if not isinstance(idx, Value) or not idx.ty.is_int:
            raise fl.error(part, f"index must be an integer, got {describe(idx)}")
        index = ops.index_to_i64(b, idx.ty, idx.ir)

        def make_site(dim=dim, part=part):
            return fl.ctx.site(fl, part, f"index out of range in dimension {dim} of "
                                         f"'{base.name}'")
        index = target.check_index(fl.ctx, index, base.shape[dim], make_site)
        term = b.mul(index, base.strides[dim])
        offset = term if offset is None else b.add(offset, term)
    return b.gep(base.ir, [offset])


def attribute(fl, node: ast.Attribute, base: NdArrayValue):
    """`x.shape` / `x.strides`: tuples of i64 (strides in elements); `x.ndim`: the rank."""
    if node.attr == "shape":
        return TupleValue(tuple(Value(i64, s) for s in base.shape))
    if node.attr == "strides":
        return TupleValue(tuple(Value(i64, s) for s in base.strides))
    if node.attr == "ndim":
        return ConstValue(base.ty.rank)
    raise fl.error(node, f"array parameter '{base.name}' ({base.ty}) has no attribute "
                   f"'{node.attr}' (it has {', '.join(ATTRIBUTES)})")
