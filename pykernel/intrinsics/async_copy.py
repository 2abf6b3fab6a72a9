"""Asynchronous global -> shared copies (`cp.async`, sm_80+) and the warp barrier.

    pk.cp_async(dst, i, src, j)   16 bytes from src[j..] (global) to dst[i..] (shared memory),
                                  issued, not waited on; both addresses 16-byte aligned;
                                  size=4 / 8 smaller copies, src_size=n reads only n bytes
                                  and zero-fills the rest
    pk.cp_async_commit()          close this thread's group of copies issued since the last one
    pk.cp_async_wait(n)           wait until at most n (a constant, 0..7) of this thread's
                                  committed groups are still in flight
    pk.syncwarp()                 the lanes of the warp meet here (`bar.warp.sync -1`): after a
                                  cp_async_wait, every lane's copies are visible to the warp

A copy ring: issue the copies of stage s + 1, commit, `cp_async_wait(1)` (stage s landed),
`syncwarp()` (every lane's part of it), read stage s. The copy does not pass through registers,
so the loads of the next stages stay in flight while the current one is computed. On the CPU
target the copy happens at once (commit and wait do nothing) and syncwarp is a warp operation
that every lane of the warp must reach.
"""
from __future__ import annotations

from ..lower.memory import element_pointer
from ..lower.values import ArrayValue, ConstValue, PtrValue
from ..types import u32
from .base import args_of, groups_in_flight, intrinsic, target_statement

COPY_BYTES = 16


def _space(value) -> str:
    if isinstance(value, PtrValue):
        return value.ty.space
    if isinstance(value, ArrayValue):
        return value.ty.space
    return ""


@intrinsic("cp_async")
def cp_async(fl, node):
    """`pk.cp_async(dst, i, src, j, size=16, src_size=None)`: `cp.async.cg.shared.global
    [&dst[i]], [&src[j]], 16` (`.ca` for size 4 or 8; sm_80+); dst a shared array or shared
    pointer, src a global pointer; both addresses aligned to size. src_size (bytes, runtime):
    read only that many, the rest of the size bytes are zero-filled (a copy at the end of a
    buffer)."""
    if not 4 <= len(node.args) <= 6:
        raise fl.error(node, "pk.cp_async(dst, i, src, j, size=16, src_size=None) takes 4 to 6 "
                       "arguments")
    fl.ctx.require_arch(80, "cp.async", fl, node)
    extra = dict(zip(("size", "src_size"), node.args[4:]))
    for kw in node.keywords:
        if kw.arg not in ("size", "src_size") or kw.arg in extra:
            raise fl.error(node, f"pk.cp_async() got an unexpected keyword '{kw.arg}'")
        extra[kw.arg] = kw.value
    size = fl.expr(extra["size"]) if "size" in extra else ConstValue(COPY_BYTES)
    if not isinstance(size, ConstValue) or size.value not in (4, 8, 16):
        raise fl.error(node, "pk.cp_async: size must be a compile-time 4, 8 or 16 (bytes)")
    src_size = None
    if "src_size" in extra:
        src_size = fl.coerce(fl.expr(extra["src_size"]), u32, node)
    if _space(fl.expr(node.args[0])) != "shared":
        raise fl.error(node.args[0], "pk.cp_async copies into shared memory: dst must be a "
                       "pk.shared_array or pk.dynamic_shared pointer")
    if _space(fl.expr(node.args[2])) != "global":
        raise fl.error(node.args[2], "pk.cp_async copies from global memory: src must be a "
                       "kernel pointer argument")
    dst = element_pointer(fl, node, node.args[0], node.args[1])
    src = element_pointer(fl, node, node.args[2], node.args[3])
    site = fl.ctx.site(fl, node, "out-of-bounds cp.async")
    fl.ctx.target.cp_async(fl.ctx, dst, src, size.value, src_size, site)
    return ConstValue(None)


cp_async_commit = target_statement(
    "cp_async_commit", 80, "cp.async",
    "`pk.cp_async_commit()`: `cp.async.commit_group` (nothing on the CPU target).")


@intrinsic("cp_async_wait")
def cp_async_wait(fl, node):
    """`pk.cp_async_wait(n)`: `cp.async.wait_group n`, n a compile-time constant 0..7 (nothing
    on the CPU target, whose copies are done when issued)."""
    fl.ctx.require_arch(80, "cp.async", fl, node)
    fl.ctx.target.cp_async_wait(fl.ctx, groups_in_flight(fl, node, "cp_async_wait", 8))
    return ConstValue(None)


@intrinsic("syncwarp")
def syncwarp(fl, node):
    """`pk.syncwarp()`: `bar.warp.sync -1`, a barrier (and memory ordering) of the warp's
    lanes; every lane must reach it."""
    args_of(fl, node, 0, "syncwarp")
    fl.ctx.uses.add("warp")
    fl.ctx.target.syncwarp(fl.ctx, fl.ctx.site(fl, node, "syncwarp"))
    return ConstValue(None)
