"""Thread-block clusters (sm_90+): blocks launched together on one GPC that can synchronise
with each other and read and write each other's shared memory (distributed shared memory).

    kernel[grid, block, stream, shared_bytes, cluster](...)   cluster: blocks per cluster, an
                                           int or (x, y, z); each grid extent a multiple of it
    pk.cluster_rank()                      this block's rank in its cluster, 0..size-1
                                           (x fastest, as %cluster_ctarank)
    pk.cluster_size()                      blocks in the cluster (1 when launched without one)
    pk.cluster_sync()                      every thread of every block of the cluster meets
                                           here; shared-memory writes before it are visible
                                           to every block of the cluster after it
    pk.cluster_map(shared, rank)           the same element of block `rank`'s copy of a
                                           shared array / dynamic shared pointer, as a pointer
                                           (loads, stores, atomics)

A block's shared memory lives as long as the block: a block must not exit while another may
still read its memory, so a kernel that reads remote shared memory ends with a cluster_sync.
On the CPU target a cluster's blocks run on one worker as coroutines: each block runs until
all its threads wait at a cluster_sync (or finish), then the next block; a mapped pointer is
bounds-checked against the remote block's array.
"""
from __future__ import annotations

from ..lower.values import ArrayValue, ConstValue, PtrValue, Value
from ..types import PtrType, i32
from .base import args_of, intrinsic

MAX_PORTABLE = 8          # blocks per cluster every sm_90+ GPU runs (16 with an opt-in)
MAX_CLUSTER = 16


def _cluster(fl, node, name, together=False):
    """together: the blocks of a cluster must run at the same time (CPU target: one worker
    runs them interleaved, cpu_runner.cluster_scheduler)."""
    fl.ctx.require_arch(90, f"pk.{name}", fl, node)
    fl.ctx.uses.add("cluster")
    if together:
        fl.ctx.uses.add("cluster_together")


@intrinsic("cluster_rank")
def cluster_rank(fl, node):
    """This block's rank in its cluster: `mov.u32 %r, %cluster_ctarank`."""
    args_of(fl, node, 0, "cluster_rank")
    _cluster(fl, node, "cluster_rank")
    return Value(i32, fl.ctx.target.cluster_register(fl.ctx, "rank"))


@intrinsic("cluster_size")
def cluster_size(fl, node):
    """Blocks in this block's cluster: `mov.u32 %r, %cluster_nctarank`."""
    args_of(fl, node, 0, "cluster_size")
    _cluster(fl, node, "cluster_size")
    return Value(i32, fl.ctx.target.cluster_register(fl.ctx, "size"))


@intrinsic("cluster_sync")
def cluster_sync(fl, node):
    """Cluster-wide barrier: `barrier.cluster.arrive.release.aligned` then
    `barrier.cluster.wait.acquire.aligned`; every thread of the cluster must reach it."""
    args_of(fl, node, 0, "cluster_sync")
    _cluster(fl, node, "cluster_sync", together=True)
    fl.ctx.uses.add("barrier")
    fl.ctx.target.cluster_sync(fl.ctx, fl.ctx.site(fl, node, "cluster_sync"))
    return ConstValue(None)


@intrinsic("cluster_map")
def cluster_map(fl, node):
    """`pk.cluster_map(shared, rank)`: `mapa.u64` of the generic address of a shared array or
    shared pointer into block `rank`'s shared memory; a pointer to the same element there."""
    (base, rank), _ = args_of(fl, node, 2, "cluster_map")
    if not isinstance(base, (ArrayValue, PtrValue)) or base.ty.space != "shared":
        raise fl.error(node.args[0], "pk.cluster_map maps shared memory: pass a "
                       "pk.shared_array or a pk.dynamic_shared pointer")
    _cluster(fl, node, "cluster_map", together=True)
    rank = fl.coerce(rank, i32, node.args[1])
    site = fl.ctx.site(fl, node, "cluster_map")
    ptr, origin = fl.ctx.target.cluster_map(fl.ctx, base.ir, base.origin, rank.ir, site)
    return PtrValue(PtrType(base.ty.elem, False, "cluster"), ptr, origin)


__all__ = ["cluster_rank", "cluster_size", "cluster_sync", "cluster_map"]
