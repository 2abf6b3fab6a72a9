"""IR helpers over the CPU target's per-thread state words (cpu_abi: kind in the top byte,
source site below): loops, scans for threads in a state, releasing them, and recording the
first error of a launch. Shared by the scheduler (cpu_runner.py) and the intrinsics that
block (cpu_bulk, cpu_tma, cpu_hopper, cpu_collectives)."""
from __future__ import annotations

from llvmlite import ir

from . import cpu_abi as abi

I64, I32, I1 = ir.IntType(64), ir.IntType(32), ir.IntType(1)


class Loop:
    """`for i in range(start, stop)` in IR: `with Loop(b, start, stop) as i: ...`."""

    def __init__(self, b: ir.IRBuilder, start, stop, name="i"):
        self.b, self.start, self.stop, self.name = b, start, stop, name

    def __enter__(self):
        b, fn = self.b, self.b.function
        self.pre = b.block
        self.cond = fn.append_basic_block(self.name + ".cond")
        self.body = fn.append_basic_block(self.name + ".body")
        self.end = fn.append_basic_block(self.name + ".end")
        b.branch(self.cond)
        b.position_at_end(self.cond)
        self.phi = b.phi(self.start.type, self.name)
        self.phi.add_incoming(self.start, self.pre)
        b.cbranch(b.icmp_signed("<", self.phi, self.stop), self.body, self.end)
        b.position_at_end(self.body)
        return self.phi

    def __exit__(self, *exc):
        b = self.b
        if not b.block.is_terminated:
            nxt = b.add(self.phi, ir.Constant(self.phi.type, 1))
            self.phi.add_incoming(nxt, b.block)
            b.branch(self.cond)
        b.position_at_end(self.end)
        return False


def bump_progress(b, e):
    slot = b.gep(e.ctx_ptr, [ir.Constant(I64, abi.PROGRESS)])
    b.store(b.add(b.load(slot), ir.Constant(I64, 1)), slot)


def scan(b, state, lo, hi, kind):
    """Over threads [lo, hi) in `kind` (one or a tuple): (first site, any site differs,
    count)."""
    fn = b.function
    site_slot = entry_alloca(fn, I64)
    bad_slot = entry_alloca(fn, I1)
    count_slot = entry_alloca(fn, I64)
    b.store(ir.Constant(I64, -1), site_slot)
    b.store(ir.Constant(I1, 0), bad_slot)
    b.store(ir.Constant(I64, 0), count_slot)
    with Loop(b, lo, hi, "scan") as t:
        s = b.load(b.gep(state, [t]))
        high = b.lshr(s, ir.Constant(I32, 24))
        kinds = kind if isinstance(kind, tuple) else (kind,)
        match = b.icmp_unsigned("==", high, ir.Constant(I32, kinds[0]))
        for k in kinds[1:]:
            match = b.or_(match, b.icmp_unsigned("==", high, ir.Constant(I32, k)))
        with b.if_then(match):
            site = b.zext(b.and_(s, ir.Constant(I32, 0xFFFFFF)), I64)
            prev = b.load(site_slot)
            unset = b.icmp_signed("==", prev, ir.Constant(I64, -1))
            b.store(b.select(unset, site, prev), site_slot)
            differs = b.and_(b.not_(unset), b.icmp_signed("!=", prev, site))
            b.store(b.or_(b.load(bad_slot), differs), bad_slot)
            b.store(b.add(b.load(count_slot), ir.Constant(I64, 1)), count_slot)
    return b.load(site_slot), b.load(bad_slot), b.load(count_slot)


def release(b, state, lo, hi, kind):
    with Loop(b, lo, hi, "rel") as t:
        p = b.gep(state, [t])
        s = b.load(p)
        with b.if_then(b.icmp_unsigned("==", b.lshr(s, ir.Constant(I32, 24)),
                                       ir.Constant(I32, kind))):
            b.store(ir.Constant(I32, abi.RUNNING), p)


def record_error(b, ctx_ptr, code, site):
    slot = b.gep(ctx_ptr, [ir.Constant(I64, abi.ERROR_CODE)])
    with b.if_then(b.icmp_signed("==", b.load(slot), ir.Constant(I64, 0))):
        b.store(code if isinstance(code, ir.Value) else ir.Constant(I64, code), slot)
        b.store(site, b.gep(ctx_ptr, [ir.Constant(I64, abi.ERROR_SITE)]))


def entry_alloca(fn, ty):
    entry = fn.entry_basic_block
    b = ir.IRBuilder(entry)
    b.position_at_start(entry)
    return b.alloca(ty)
