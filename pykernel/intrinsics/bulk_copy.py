"""Hopper bulk copies (`cp.async.bulk`, the TMA engine without a tensor map) and the mbarriers
that count their bytes (sm_90+).

    pk.mbarrier_init(bar, i, count)        bar[i] (a u64 in shared memory) expects `count`
                                           arrivals per phase; phase 0 starts
    pk.fence_mbarrier_init()               make the init visible (to copies too); then a
                                           syncthreads / syncwarp before other threads use it
    pk.mbarrier_arrive(bar, i)             one arrival
    pk.mbarrier_arrive_expect_tx(bar, i, nbytes)   one arrival, and nbytes more to land
    pk.mbarrier_expect_tx(bar, i, nbytes)  nbytes more to land (no arrival)
    pk.mbarrier_wait(bar, i, parity)       block until the phase of that parity (0, 1, 0, ...)
                                           has completed: all arrivals made, all bytes landed
    pk.bulk_copy(dst, i, src, j, nbytes, bar, k)   nbytes (a multiple of 16, both addresses
                                           16-byte aligned) global src[j..] -> shared dst[i..],
                                           one instruction; its bytes count toward bar[k]
    pk.fence_proxy_async()                 order this thread's shared-memory writes before
                                           later bulk operations that read them
    pk.bulk_prefetch_l2(src, j, nbytes)    a hint: nbytes (as bulk_copy's) of global src[j..]
                                           into L2 by the copy engine, one instruction, no
                                           barrier, no result

A ring: lane 0 calls arrive_expect_tx(stage bytes) and the stage's bulk copies, every lane waits
with parity (use count of the stage) & 1, reads, syncwarp, and the stage is refilled. On the CPU
target a copy happens when issued and the barrier's phase, arrivals and byte count are tracked
exactly; a wait that cannot complete suspends the thread until other threads have run, and one
that never can is reported as a deadlock.
"""
from __future__ import annotations

from ..lower.memory import element_pointer
from ..lower.values import ConstValue, Value
from ..types import i32, u32, u64
from .async_copy import _space
from .base import intrinsic, target_statement

ALIGN = 16
MAX_COUNT = (1 << 20) - 1     # arrivals per phase, and the |tx-count| limit (PTX ISA)


def _barrier(fl, node, bar_node, index_node, name):
    bar = fl.expr(bar_node)
    if _space(bar) != "shared" or getattr(bar.ty, "elem", None) != u64:
        raise fl.error(bar_node, f"pk.{name}: the mbarrier must be a u64 in shared memory "
                       "(pk.shared_array(u64, n))")
    return element_pointer(fl, node, bar_node, index_node)


def _word(fl, node, arg_node, what, name, limit=MAX_COUNT):
    """A 32-bit count argument: a literal (checked against 0..limit, or 0..2^32-1 when limit
    is None) or an i32/u32 value."""
    val = fl.expr(arg_node)
    if isinstance(val, ConstValue):
        limit = (1 << 32) - 1 if limit is None else limit
        if not isinstance(val.value, int) or not 0 <= val.value <= limit:
            raise fl.error(arg_node, f"pk.{name}: {what} must be 0..{limit}, got "
                           f"{val.value!r}")
        return fl.coerce(val, u32, arg_node), val.value
    if not isinstance(val, Value) or val.ty not in (i32, u32):
        raise fl.error(arg_node, f"pk.{name}: {what} must be an i32 or u32")
    return val, None


def _mbarrier_op(name, nargs, doc):
    def lower(fl, node):
        if len(node.args) != nargs or node.keywords:
            raise fl.error(node, f"pk.{name}() takes {nargs} arguments")
        fl.ctx.require_arch(90, "mbarrier", fl, node)
        bar = _barrier(fl, node, node.args[0], node.args[1], name)
        site = fl.ctx.site(fl, node, name)
        extra = None
        if nargs == 3:
            what = {"mbarrier_init": "count", "mbarrier_wait": "parity"}.get(name, "nbytes")
            extra, value = _word(fl, node, node.args[2], what, name)
            if name == "mbarrier_init" and value == 0:
                raise fl.error(node.args[2], "pk.mbarrier_init: count must be at least 1")
        getattr(fl.ctx.target, name)(fl.ctx, bar, extra, site)
        return ConstValue(None)
    lower.__doc__ = doc
    return intrinsic(name)(lower)


mbarrier_init = _mbarrier_op(
    "mbarrier_init", 3, "`pk.mbarrier_init(bar, i, count)`: `mbarrier.init.shared::cta.b64`.")
mbarrier_arrive = _mbarrier_op(
    "mbarrier_arrive", 2, "`pk.mbarrier_arrive(bar, i)`: `mbarrier.arrive.shared::cta.b64`.")
mbarrier_arrive_expect_tx = _mbarrier_op(
    "mbarrier_arrive_expect_tx", 3, "`pk.mbarrier_arrive_expect_tx(bar, i, nbytes)`: "
    "`mbarrier.arrive.expect_tx.shared::cta.b64`.")
mbarrier_expect_tx = _mbarrier_op(
    "mbarrier_expect_tx", 3, "`pk.mbarrier_expect_tx(bar, i, nbytes)`: "
    "`mbarrier.expect_tx.relaxed.cta.shared::cta.b64`.")
mbarrier_wait = _mbarrier_op(
    "mbarrier_wait", 3, "`pk.mbarrier_wait(bar, i, parity)`: a loop of "
    "`mbarrier.try_wait.parity.shared::cta.b64` until the phase of that parity completed.")


def _copy_size(fl, node, arg_node, name, limit=MAX_COUNT):
    """A copy's byte count: as _word, and a literal one a positive multiple of ALIGN."""
    nbytes, value = _word(fl, node, arg_node, "nbytes", name, limit)
    if value is not None and (value == 0 or value % ALIGN):
        raise fl.error(arg_node, f"pk.{name}: nbytes must be a positive multiple of {ALIGN}, "
                       f"got {value}")
    return nbytes


@intrinsic("bulk_copy")
def bulk_copy(fl, node):
    """`pk.bulk_copy(dst, i, src, j, nbytes, bar, k)`: `cp.async.bulk.shared::cluster.global.
    mbarrier::complete_tx::bytes [&dst[i]], [&src[j]], nbytes, [&bar[k]]` (sm_90+)."""
    if len(node.args) != 7 or node.keywords:
        raise fl.error(node, "pk.bulk_copy(dst, i, src, j, nbytes, bar, k) takes 7 arguments")
    fl.ctx.require_arch(90, "cp.async.bulk", fl, node)
    if _space(fl.expr(node.args[0])) != "shared":
        raise fl.error(node.args[0], "pk.bulk_copy copies into shared memory: dst must be a "
                       "pk.shared_array or pk.dynamic_shared pointer")
    if _space(fl.expr(node.args[2])) != "global":
        raise fl.error(node.args[2], "pk.bulk_copy copies from global memory: src must be a "
                       "kernel pointer argument")
    nbytes = _copy_size(fl, node, node.args[4], "bulk_copy")
    dst = element_pointer(fl, node, node.args[0], node.args[1])
    src = element_pointer(fl, node, node.args[2], node.args[3])
    bar = _barrier(fl, node, node.args[5], node.args[6], "bulk_copy")
    site = fl.ctx.site(fl, node, "bulk copy")
    fl.ctx.target.bulk_copy(fl.ctx, dst, src, nbytes, bar, site)
    return ConstValue(None)


@intrinsic("bulk_prefetch_l2")
def bulk_prefetch_l2(fl, node):
    """`pk.bulk_prefetch_l2(src, j, nbytes)`: `cp.async.bulk.prefetch.L2.global [&src[j]],
    nbytes` (sm_90+): the copy engine brings a whole range into L2, so one thread can stream a
    block's next inputs while it waits (e.g. before `pk.grid_dependency_wait()`). A hint: L2 is
    where global memory is coherent, so prefetched lines are never stale. The CPU target checks
    alignment and bounds as for bulk_copy and copies nothing."""
    if len(node.args) != 3 or node.keywords:
        raise fl.error(node, "pk.bulk_prefetch_l2(src, j, nbytes) takes 3 arguments")
    fl.ctx.require_arch(90, "cp.async.bulk.prefetch", fl, node)
    if _space(fl.expr(node.args[0])) != "global":
        raise fl.error(node.args[0], "pk.bulk_prefetch_l2 prefetches global memory: src must be "
                       "a kernel pointer argument")
    nbytes = _copy_size(fl, node, node.args[2], "bulk_prefetch_l2", limit=None)
    src = element_pointer(fl, node, node.args[0], node.args[1])
    site = fl.ctx.site(fl, node, "bulk prefetch")
    fl.ctx.target.bulk_prefetch_l2(fl.ctx, src, nbytes, site)
    return ConstValue(None)


fence_mbarrier_init = target_statement(
    "fence_mbarrier_init", 90, "fence.mbarrier.init",
    "`pk.fence_mbarrier_init()`: `fence.mbarrier_init.release.cluster` (nothing on the CPU "
    "target).")
fence_proxy_async = target_statement(
    "fence_proxy_async", 90, "fence.proxy.async",
    "`pk.fence_proxy_async()`: `fence.proxy.async.shared::cta` (nothing on the CPU target).")
