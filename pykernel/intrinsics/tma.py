"""TMA tensor copies (sm_90+): tiles of a 1..5-d global tensor described by a tensor map
(`pk.TensorMap` parameter, built on the host by `pk.tensor_map`) to and from shared memory.

    pk.tma_load(dst, i, tmap, (c...), bar, k)   the box whose first element is at coordinates
                                           (c...) (numpy order, outermost first, i32, may be
                                           negative or past the end: those elements read as 0)
                                           -> shared dst[i..], densely in box order (swizzled
                                           as the map says); its bytes count toward bar[k]
    pk.tma_load(..., multicast=mask)       the same box into every block of the cluster whose
                                           rank bit is set in mask (u16), each block's bar[k]
                                           counting it
    pk.tma_store(tmap, (c...), src, i)     shared src[i..] -> the box at (c...); elements
                                           outside the tensor are not written
    pk.bulk_commit_group()                 close the group of stores issued since the last
    pk.bulk_wait_group(n)                  wait until at most n store groups are pending
    pk.bulk_wait_group_read(n)             ... until their shared sources may be reused
    pk.prefetch_tensormap(tmap)            a hint: bring the map into the descriptor cache

The shared destination / source must be 128-byte aligned (the swizzle repeat, 1024 bytes for
128-byte swizzle, for the wgmma descriptors that read it). One thread issues a load after
`pk.mbarrier_arrive_expect_tx(bar, k, box bytes)`; threads wait with `pk.mbarrier_wait`.
Before a store, the threads that wrote src call `pk.fence_proxy_async()` and synchronise.
On the CPU target a copy happens when issued, honouring box, strides, out-of-bounds fill and
swizzle (cpu_tma.py), and completes the barrier's bytes as bulk_copy does.
"""
from __future__ import annotations

import ast

from llvmlite import ir

from ..lower.memory import element_pointer
from ..lower.values import ConstValue, TensorMapValue, TupleValue, Value, describe
from ..types import i32
from .async_copy import _space
from .base import args_of, groups_in_flight, intrinsic, target_statement
from .bulk_copy import _barrier

MAX_RANK = 5
MAX_CLUSTER = 16
I16 = ir.IntType(16)


def _tensor_map(fl, arg_node, name):
    tmap = fl.expr(arg_node)
    if not isinstance(tmap, TensorMapValue):
        raise fl.error(arg_node, f"pk.{name}: expected a pk.TensorMap parameter, got "
                       f"{describe(tmap)}")
    return tmap


def _coordinates(fl, arg_node, name):
    """A tuple of 1..5 i32 coordinates, numpy order -> their IR values."""
    if isinstance(arg_node, (ast.Tuple, ast.List)):
        items = [(fl.expr(e), e) for e in arg_node.elts]
    else:
        val = fl.expr(arg_node)
        if not isinstance(val, TupleValue):
            raise fl.error(arg_node, f"pk.{name}: the coordinates are a tuple (c0, c1, ...) "
                           f"in the array's index order, got {describe(val)}")
        items = [(v, arg_node) for v in val.items]
    if not 1 <= len(items) <= MAX_RANK:
        raise fl.error(arg_node, f"pk.{name}: a tensor map has 1..{MAX_RANK} dimensions, got "
                       f"{len(items)} coordinates")
    out = []
    for val, node in items:
        if isinstance(val, Value) and not val.ty.is_int:
            raise fl.error(node, f"pk.{name}: coordinates are integers (i32), got "
                           f"{describe(val)}")
        out.append(fl.coerce(val, i32, node).ir)
    return out


@intrinsic("tma_load")
def tma_load(fl, node):
    """`pk.tma_load(dst, i, tmap, (c...), bar, k, multicast=mask)`: `cp.async.bulk.tensor.
    <r>d.shared::cluster.global.tile.mbarrier::complete_tx::bytes[.multicast::cluster]
    [&dst[i]], [tmap, {c reversed}], [&bar[k]][, mask]` (sm_90+)."""
    (_, _, _, _, _, _), kwargs = args_of(fl, node, 6, "tma_load", keywords=("multicast",))
    fl.ctx.require_arch(90, "cp.async.bulk.tensor", fl, node)
    if _space(fl.expr(node.args[0])) != "shared":
        raise fl.error(node.args[0], "pk.tma_load copies into shared memory: dst must be a "
                       "pk.shared_array or pk.dynamic_shared pointer")
    tmap = _tensor_map(fl, node.args[2], "tma_load")
    coords = _coordinates(fl, node.args[3], "tma_load")
    dst = element_pointer(fl, node, node.args[0], node.args[1])
    bar = _barrier(fl, node, node.args[4], node.args[5], "tma_load")
    mask = None
    if "multicast" in kwargs:
        mask = _multicast_mask(fl, node, kwargs["multicast"])
        fl.ctx.uses.update(("cluster", "cluster_together"))
    site = fl.ctx.site(fl, node, "tensor copy (TMA load)")
    fl.ctx.target.tma_load(fl.ctx, dst, tmap, coords, bar, mask, site)
    return ConstValue(None)


def _multicast_mask(fl, node, mask):
    """A 16-bit mask of cluster ranks: a literal 1..0xFFFF or an integer value (its low 16
    bits)."""
    value_node = next(kw.value for kw in node.keywords if kw.arg == "multicast")
    if isinstance(mask, ConstValue):
        if not isinstance(mask.value, int) or not 0 < mask.value < 1 << MAX_CLUSTER:
            raise fl.error(value_node, "pk.tma_load: multicast is a mask of cluster ranks "
                           f"(1..0xFFFF), got {mask.value!r}")
        return ir.Constant(I16, mask.value)
    if not (isinstance(mask, Value) and mask.ty.is_int):
        raise fl.error(value_node, f"pk.tma_load: multicast is an integer mask, got "
                       f"{describe(mask)}")
    if mask.ty.bits > 16:
        return fl.b.trunc(mask.ir, I16)
    return fl.b.zext(mask.ir, I16) if mask.ty.bits < 16 else mask.ir


@intrinsic("tma_store")
def tma_store(fl, node):
    """`pk.tma_store(tmap, (c...), src, i)`: `cp.async.bulk.tensor.<r>d.global.shared::cta.
    tile.bulk_group [tmap, {c reversed}], [&src[i]]` (sm_90+); complete it with
    pk.bulk_commit_group() and pk.bulk_wait_group[_read](n)."""
    args_of(fl, node, 4, "tma_store")
    fl.ctx.require_arch(90, "cp.async.bulk.tensor", fl, node)
    tmap = _tensor_map(fl, node.args[0], "tma_store")
    coords = _coordinates(fl, node.args[1], "tma_store")
    if _space(fl.expr(node.args[2])) != "shared":
        raise fl.error(node.args[2], "pk.tma_store copies from shared memory: src must be a "
                       "pk.shared_array or pk.dynamic_shared pointer")
    src = element_pointer(fl, node, node.args[2], node.args[3])
    site = fl.ctx.site(fl, node, "tensor copy (TMA store)")
    fl.ctx.target.tma_store(fl.ctx, tmap, coords, src, site)
    return ConstValue(None)


bulk_commit_group = target_statement(
    "bulk_commit_group", 90, "cp.async.bulk.commit_group",
    "`pk.bulk_commit_group()`: `cp.async.bulk.commit_group` (nothing on the CPU target).")


def _wait_group(name, read, doc):
    def lower(fl, node):
        fl.ctx.require_arch(90, "cp.async.bulk.wait_group", fl, node)
        fl.ctx.target.bulk_wait_group(fl.ctx, groups_in_flight(fl, node, name, 64), read)
        return ConstValue(None)
    lower.__doc__ = doc
    return intrinsic(name)(lower)


bulk_wait_group = _wait_group("bulk_wait_group", False, "`pk.bulk_wait_group(n)`: "
                              "`cp.async.bulk.wait_group n`: at most n store groups pending, "
                              "the others' writes done (nothing on the CPU target).")
bulk_wait_group_read = _wait_group("bulk_wait_group_read", True, "`pk.bulk_wait_group_read(n)`"
                                   ": `cp.async.bulk.wait_group.read n`: the sources of all "
                                   "but n groups read (nothing on the CPU target).")


@intrinsic("prefetch_tensormap")
def prefetch_tensormap(fl, node):
    """`pk.prefetch_tensormap(tmap)`: `prefetch.tensormap [tmap]` (sm_90+; a hint, nothing on
    the CPU target)."""
    args_of(fl, node, 1, "prefetch_tensormap")
    fl.ctx.require_arch(90, "prefetch.tensormap", fl, node)
    tmap = _tensor_map(fl, node.args[0], "prefetch_tensormap")
    fl.ctx.target.prefetch_tensormap(fl.ctx, tmap)
    return ConstValue(None)


__all__ = ["bulk_commit_group", "bulk_wait_group", "bulk_wait_group_read",
           "prefetch_tensormap", "tma_load", "tma_store"]
