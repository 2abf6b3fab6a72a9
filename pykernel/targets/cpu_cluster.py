"""CPU-target lowering of thread-block clusters (intrinsics/cluster.py), mixed into CPUTarget.

A kernel that synchronises a cluster or maps shared memory runs each cluster's blocks on one
worker (cpu_runner.cluster_scheduler): the cluster's shared memory is one buffer, block r's
part at r * SHARED_STRIDE bytes, so a mapped pointer is the same address moved by
(rank - own rank) * SHARED_STRIDE. The rank follows %cluster_ctarank: x fastest."""
from __future__ import annotations

from llvmlite import ir

from . import cpu_abi as abi

I64, I32 = ir.IntType(64), ir.IntType(32)


class CPUClusterOps:
    def _cluster_dims(self, ctx):
        return [ctx.builder.trunc(self.ctx_slot(ctx, abi.CLUSTER + k), I32) for k in range(3)]

    def cluster_register(self, ctx, which):
        b = ctx.builder
        cx, cy, cz = self._cluster_dims(ctx)
        if which == "size":
            return b.mul(b.mul(cx, cy), cz)
        bx, by, bz = ctx.target_data["bid"]
        return b.add(b.urem(bx, cx), b.mul(cx, b.add(b.urem(by, cy),
                                                     b.mul(cy, b.urem(bz, cz)))))

    def cluster_sync(self, ctx, site):
        self.suspend(ctx, abi.AT_CLUSTER, site)

    def cluster_map(self, ctx, ptr, origin, rank, site):
        b = ctx.builder
        self._coro_blocks(ctx)         # the cluster's blocks must be alive together
        own = self.cluster_register(ctx, "rank")
        size = self.cluster_register(ctx, "size")
        bad = b.icmp_unsigned(">=", rank, size)      # negative ranks are huge unsigned
        with b.if_then(bad, likely=False):
            self.fail(ctx, 9, site, b.sext(rank, I64))
        rank = b.select(bad, own, rank)
        delta = b.mul(b.sext(b.sub(rank, own), I64), self.ctx_slot(ctx, abi.SHARED_STRIDE))

        def remote(p):
            return b.inttoptr(b.add(b.ptrtoint(p, I64), delta), p.type)
        if isinstance(origin, tuple) and origin[0] in ("array", "range", "bounds"):
            origin = (origin[0], remote(origin[1])) + tuple(origin[2:])
        return remote(ptr), origin
