"""NVPTX lowering of bulk copies and mbarriers (intrinsics/bulk_copy.py), mixed into
NVPTXTarget: inline PTX (PTX ISA 8.0, sm_90), shared addresses as 32 bits, global ones as 64."""
from __future__ import annotations

import functools

from llvmlite import ir

I32, I64 = ir.IntType(32), ir.IntType(64)


def _asm(builder, text, constraints, args, ret=None):
    fnty = ir.FunctionType(ret or ir.VoidType(), [a.type for a in args])
    clobbers = ",".join(c for c in (constraints, "~{memory}") if c)
    asm = ir.InlineAsm(fnty, text, clobbers, side_effect=True)
    return builder.call(asm, args)


def ptx_isa(version: int):
    """A method emitting instructions newer than the arch's default PTX ISA raises the
    module's .version (NVPTXBulkOps.min_ptx) to `version` (80: 8.0) when it is used."""
    def wrap(method):
        @functools.wraps(method)
        def emit(self, *args, **kwargs):
            self.min_ptx = max(self.min_ptx, version)
            return method(self, *args, **kwargs)
        return emit
    return wrap


class NVPTXBulkOps:
    min_ptx = 0

    def _bar_address(self, ctx, bar, site):
        self.check_address(ctx, bar.ptr, bar.elem, bar.origin, site)
        return ctx.builder.ptrtoint(bar.ptr, I32)

    @ptx_isa(80)
    def mbarrier_init(self, ctx, bar, count, site):
        _asm(ctx.builder, "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r",
             [self._bar_address(ctx, bar, site), count.ir])

    @ptx_isa(80)
    def mbarrier_arrive(self, ctx, bar, _unused, site):
        _asm(ctx.builder, "mbarrier.arrive.shared::cta.b64 _, [$0];", "r",
             [self._bar_address(ctx, bar, site)])

    @ptx_isa(80)
    def mbarrier_arrive_expect_tx(self, ctx, bar, nbytes, site):
        _asm(ctx.builder, "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", "r,r",
             [self._bar_address(ctx, bar, site), nbytes.ir])

    @ptx_isa(80)
    def mbarrier_expect_tx(self, ctx, bar, nbytes, site):
        _asm(ctx.builder, "mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [$0], $1;", "r,r",
             [self._bar_address(ctx, bar, site), nbytes.ir])

    @ptx_isa(80)
    def mbarrier_wait(self, ctx, bar, parity, site):
        """try_wait suspends the thread for a while in hardware; loop until it succeeds."""
        b = ctx.builder
        addr = self._bar_address(ctx, bar, site)
        check, done = ctx.append_block("mbar.wait"), ctx.append_block("mbar.done")
        b.branch(check)
        b.position_at_end(check)
        ok = _asm(b, "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; "
                  "selp.u32 $0, 1, 0, p; }", "=r,r,r", [addr, parity.ir], ret=I32)
        b.cbranch(b.icmp_unsigned("!=", ok, ir.Constant(I32, 0)), done, check)
        b.position_at_end(done)

    @ptx_isa(80)
    def bulk_copy(self, ctx, dst, src, nbytes, bar, site):
        size = ctx.builder.zext(nbytes.ir, I64)
        self.check_address(ctx, dst.ptr, dst.elem, dst.origin, site, size)
        self.check_address(ctx, src.ptr, src.elem, src.origin, site, size)
        b = ctx.builder
        _asm(b, "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
             "[$0], [$1], $2, [$3];", "r,l,r,r",
             [b.ptrtoint(dst.ptr, I32), b.ptrtoint(src.ptr, I64), nbytes.ir,
              self._bar_address(ctx, bar, site)])

    @ptx_isa(80)
    def bulk_prefetch_l2(self, ctx, src, nbytes, site):
        size = ctx.builder.zext(nbytes.ir, I64)
        self.check_address(ctx, src.ptr, src.elem, src.origin, site, size)
        b = ctx.builder
        _asm(b, "cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r",
             [b.ptrtoint(src.ptr, I64), nbytes.ir])

    @ptx_isa(80)
    def fence_mbarrier_init(self, ctx):
        _asm(ctx.builder, "fence.mbarrier_init.release.cluster;", "", [])

    @ptx_isa(80)
    def fence_proxy_async(self, ctx):
        _asm(ctx.builder, "fence.proxy.async.shared::cta;", "", [])
