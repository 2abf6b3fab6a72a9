"""CPU-target lowering of bulk copies and mbarriers (intrinsics/bulk_copy.py), mixed into
CPUTarget. A bulk copy happens when issued (bounds- and alignment-checked) and then counts its
bytes on the barrier. The barrier's u64 holds the PTX state exactly:

    bits 0..20   tx-count (two's complement: bytes may land before they are expected)
    bits 21..40  arrivals still pending in this phase
    bits 41..60  arrivals per phase (the init count)
    bit 63       phase parity

A phase completes when no arrival is pending and the tx-count is 0: the parity flips and the
pending count is reloaded. A wait on an incomplete phase suspends the thread (AT_MBARRIER); the
scheduler (cpu_runner.py) resumes it after other threads ran, and reports a deadlock when a
whole round of the block's threads made no progress."""
from __future__ import annotations

from llvmlite import ir

from . import cpu_abi as abi
from .cpu_thread_state import Loop

I64, I32, I1 = ir.IntType(64), ir.IntType(32), ir.IntType(1)
MAX_COUNT = (1 << 20) - 1
FIELD = ir.Constant(I64, MAX_COUNT)


def _c(v):
    return ir.Constant(I64, v)


def _fields(b, v):
    tx = b.ashr(b.shl(v, _c(43)), _c(43))
    return (tx, b.and_(b.lshr(v, _c(21)), FIELD), b.and_(b.lshr(v, _c(41)), FIELD),
            b.lshr(v, _c(63)))


def _pack(b, tx, pending, expected, phase):
    v = b.and_(tx, _c((1 << 21) - 1))
    v = b.or_(v, b.shl(pending, _c(21)))
    v = b.or_(v, b.shl(expected, _c(41)))
    return b.or_(v, b.shl(phase, _c(63)))


class CPUBulkOps:
    def _bar(self, ctx, bar, site):
        ptr = self.check_address(ctx, bar.ptr, bar.elem, bar.origin, site)
        return ctx.builder.bitcast(ptr, I64.as_pointer())

    def mbarrier_init(self, ctx, bar, count, site):
        b = ctx.builder
        ptr = self._bar(ctx, bar, site)
        n = b.zext(count.ir, I64)
        bad = b.or_(b.icmp_unsigned("==", n, _c(0)), b.icmp_unsigned(">", n, FIELD))
        with b.if_then(bad, likely=False):
            self.fail(ctx, 7, site, n)
        b.store(_pack(b, _c(0), n, n, _c(0)), ptr)

    def _update(self, ctx, ptr, tx_delta, arrive: bool, site):
        """tx-count += tx_delta, one arrival if arrive; complete the phase when due."""
        b = ctx.builder
        tx, pending, expected, phase = _fields(b, b.load(ptr))
        if arrive:
            with b.if_then(b.icmp_unsigned("==", pending, _c(0)), likely=False):
                self.fail(ctx, 7, site, pending)     # not initialised
            pending = b.sub(pending, _c(1))
        tx = b.add(tx, tx_delta)
        out = b.or_(b.icmp_signed(">", tx, _c(MAX_COUNT)), b.icmp_signed("<", tx, _c(-MAX_COUNT)))
        with b.if_then(out, likely=False):
            self.fail(ctx, 7, site, tx)
        done = b.and_(b.icmp_unsigned("==", pending, _c(0)), b.icmp_signed("==", tx, _c(0)))
        phase = b.select(done, b.xor(phase, _c(1)), phase)
        pending = b.select(done, expected, pending)
        b.store(_pack(b, tx, pending, expected, phase), ptr)

    def mbarrier_arrive(self, ctx, bar, _unused, site):
        self._update(ctx, self._bar(ctx, bar, site), _c(0), True, site)

    def mbarrier_arrive_expect_tx(self, ctx, bar, nbytes, site):
        self._update(ctx, self._bar(ctx, bar, site), ctx.builder.zext(nbytes.ir, I64), True,
                     site)

    def mbarrier_expect_tx(self, ctx, bar, nbytes, site):
        self._update(ctx, self._bar(ctx, bar, site), ctx.builder.zext(nbytes.ir, I64), False,
                     site)

    def mbarrier_wait(self, ctx, bar, parity, site):
        ctx.target_data["mbarrier_wait"] = True    # the scheduler handles AT_MBARRIER
        ptr = self._bar(ctx, bar, site)
        b = ctx.builder
        want = b.zext(b.and_(parity.ir, ir.Constant(I32, 1)), I64)
        check, stall, done = (ctx.append_block(n) for n in ("mbar.check", "mbar.stall",
                                                             "mbar.done"))
        b.branch(check)
        b.position_at_end(check)
        completed = b.icmp_unsigned("!=", b.lshr(b.load(ptr), _c(63)), want)
        b.cbranch(completed, done, stall)
        b.position_at_end(stall)
        self.suspend(ctx, abi.AT_MBARRIER, site)
        ctx.builder.branch(check)
        b.position_at_end(done)
        slot = b.gep(ctx.target_data["ctx"], [_c(abi.PROGRESS)])
        b.store(b.add(b.load(slot), _c(1)), slot)

    def _range_ok(self, ctx, addr, size):
        """(in bounds, byte offset from the start of the array) of size bytes at addr."""
        b = ctx.builder
        if addr.origin is None:
            return ir.Constant(I1, 1), _c(0)
        lo, hi = self._extent(ctx, addr.origin)
        a = b.ptrtoint(addr.ptr, I64)
        ok = b.and_(b.icmp_unsigned(">=", a, lo), b.icmp_unsigned("<=", b.add(a, size), hi))
        return ok, b.sub(a, lo)

    def bulk_copy(self, ctx, dst, src, nbytes, bar, site):
        b = ctx.builder
        size = b.zext(nbytes.ir, I64)
        d, s = b.ptrtoint(dst.ptr, I64), b.ptrtoint(src.ptr, I64)
        low = b.and_(b.or_(b.or_(d, s), size), _c(15))
        aligned = b.and_(b.icmp_unsigned("==", low, _c(0)), b.icmp_unsigned("!=", size, _c(0)))
        dok, doff = self._range_ok(ctx, dst, size)
        sok, soff = self._range_ok(ctx, src, size)
        with b.if_else(aligned) as (then, otherwise):
            with then:
                with b.if_else(b.and_(dok, sok)) as (copy, oob):
                    with copy:
                        self._copy16(ctx, d, s, size)
                    with oob:
                        self.fail(ctx, 1, site, b.select(dok, soff, doff))
            with otherwise:
                self.fail(ctx, 5, site, size)
        self._update(ctx, self._bar(ctx, bar, site), b.neg(size), False, site)

    def bulk_prefetch_l2(self, ctx, src, nbytes, site):
        """Nothing to prefetch; the checks a GPU's copy engine would fault on."""
        b = ctx.builder
        size = b.zext(nbytes.ir, I64)
        low = b.and_(b.or_(b.ptrtoint(src.ptr, I64), size), _c(15))
        aligned = b.and_(b.icmp_unsigned("==", low, _c(0)), b.icmp_unsigned("!=", size, _c(0)))
        ok, off = self._range_ok(ctx, src, size)
        with b.if_else(aligned) as (then, otherwise):
            with then:
                with b.if_then(b.not_(ok)):
                    self.fail(ctx, 1, site, off)
            with otherwise:
                self.fail(ctx, 5, site, size)

    def _copy16(self, ctx, d, s, size):
        b = ctx.builder
        vec = ir.VectorType(ir.IntType(8), 16).as_pointer()
        with Loop(b, _c(0), b.udiv(size, _c(16)), "bulk") as k:
            off = b.mul(k, _c(16))
            data = b.load(b.inttoptr(b.add(s, off), vec), align=1)
            b.store(data, b.inttoptr(b.add(d, off), vec), align=1)

    def fence_mbarrier_init(self, ctx):
        pass   # one host thread runs the block: the init is visible at once

    def fence_proxy_async(self, ctx):
        pass
