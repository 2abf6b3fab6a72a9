"""The CPU target's setmaxnreg: the hardware's register books, so that a warp-specialised
kernel whose warps together ask for more registers than its block owns fails on the CPU target
instead of hanging on the GPU.

On sm_90a a block starts with threads x R registers, R = pk.entry_registers(max_threads,
min_blocks, largest .inc count) (what ptxas gives a kernel that uses setmaxnreg). `.dec n`
moves the warp's surplus over n into a per-block pool; `.inc n` blocks until the pool holds
what the warp lacks, and takes it. Kept here per thread (a warp's 32 threads each move their
own share; the sums are the warp's):

    delta   (per thread, an alloca)   the thread's count minus R, 0 at the start
    pool    (per block, 8 hidden bytes after the kernel's static shared memory, reset to 0
            by the entry before the block's threads start)   registers released, not taken

An .inc that finds the pool short suspends (AT_REGISTERS) and retries like an mbarrier wait;
when the block stops progressing with a thread still there, the scheduler reports error 17 at
the .inc (cpu_runner.report_stuck). A .dec to more than the thread holds or an .inc to fewer
is error 16 (the PTX ISA leaves both undefined)."""
from __future__ import annotations

from llvmlite import ir

from . import cpu_abi as abi
from .archs import entry_registers

I64 = ir.IntType(64)
POOL_BYTES = 16                     # one i64, in a 16-byte slot of the static shared memory


def _c(v):
    return ir.Constant(I64, v)


def _books(fl):
    """(delta alloca, pool offset past the dynamic part, the entry-count global), made at the
    kernel's first setmaxnreg."""
    ctx = fl.ctx
    td = ctx.target_data
    if "reg_books" not in td:
        delta = ctx.alloca(I64, "regs.delta")          # set to 0 by finish_books
        offset = (ctx.shared_bytes + 15) // 16 * 16
        ctx.shared_bytes = offset + POOL_BYTES
        entry = ir.GlobalVariable(ctx.module, I64, ctx.module.get_unique_name("entry_regs"))
        entry.global_constant, entry.linkage = True, "internal"
        td["reg_books"] = (delta, offset, entry)
        td["reg_largest_inc"] = 0
    return td["reg_books"]


def finish_books(ctx, options):
    """Fix the entry count once every setmaxnreg is lowered (ptxas caps it at the largest
    .inc) and start each thread with delta = 0; returns the pool's offset past the dynamic
    shared memory, or None without setmaxnreg."""
    books = ctx.target_data.get("reg_books")
    if books is None:
        return None
    delta, offset, entry = books
    largest = ctx.target_data["reg_largest_inc"] or 256
    entry.initializer = _c(entry_registers(options.max_threads, options.min_blocks, largest))
    # the thread starts in a block of its own that zeroes delta: after coro.begin (the
    # coroutine's first resume jumps to target_data["body"]), where the frame holds it
    init = ctx.append_block("regs.init")
    b = ir.IRBuilder(init)
    b.store(_c(0), delta)
    b.branch(ctx.target_data["body"])
    ctx.target_data["body"] = init
    return offset


def setmaxnreg(fl, direction, count, node):
    ctx, b, target = fl.ctx, fl.b, fl.ctx.target
    delta, offset, entry = _books(fl)
    misuse = ctx.site(fl, node, f"setmaxnreg.{direction} {count}")
    ctx.target_data["mbarrier_wait"] = True          # the scheduler retries waiting threads
    if direction == "inc":
        ctx.target_data["reg_largest_inc"] = max(ctx.target_data["reg_largest_inc"], count)
    held = b.add(b.load(entry), b.load(delta))
    want = _c(count)
    bad = b.icmp_signed("<" if direction == "dec" else ">", held, want)
    with b.if_then(bad, likely=False):
        target.fail(ctx, abi.SETMAXNREG_MISUSE, misuse, held)
    base = b.add(target.ctx_slot(ctx, abi.SHARED_PTR), target.ctx_slot(ctx, abi.DYN_BYTES))
    pool = b.inttoptr(b.add(base, _c(offset)), I64.as_pointer())
    if direction == "dec":
        b.store(b.add(b.load(pool), b.sub(held, want)), pool)
    else:
        need = b.sub(want, held)
        check, stall, done = (ctx.append_block(n) for n in ("regs.check", "regs.stall",
                                                             "regs.done"))
        b.branch(check)
        b.position_at_end(check)
        b.cbranch(b.icmp_signed(">=", b.load(pool), need), done, stall)
        b.position_at_end(stall)
        target.suspend(ctx, abi.AT_REGISTERS, misuse)
        ctx.builder.branch(check)
        b.position_at_end(done)
        b.store(b.sub(b.load(pool), need), pool)
        progress = b.gep(ctx.target_data["ctx"], [_c(abi.PROGRESS)])
        b.store(b.add(b.load(progress), _c(1)), progress)
    b.store(b.sub(want, b.load(entry)), delta)
    return True
