"""The CPU target's entry point: runs blocks [begin, end) of the grid. Without
synchronisation, threads are a plain loop. With it, each thread is a coroutine and a scheduler
resumes them: first every lane of a warp until all reach the same warp operation (or leave
the warp phase), then every warp until all threads reach the same barrier or finish. A
thread at a different barrier, or a warp split between a warp operation and a barrier (block
or cluster), is reported as divergence instead of hanging."""
from __future__ import annotations

from llvmlite import ir

from . import cpu_abi as abi
from .cpu_coroutines import coro_decls
from .cpu_thread_state import Loop, bump_progress, entry_alloca, record_error, release, scan

I64, I32, I8, I1 = ir.IntType(64), ir.IntType(32), ir.IntType(8), ir.IntType(1)
I8P = I8.as_pointer()


class Entry:
    def __init__(self, fn, ctx_ptr):
        self.fn, self.ctx_ptr = fn, ctx_ptr

    def slot(self, b, k):
        return b.load(b.gep(self.ctx_ptr, [ir.Constant(I64, k)]))

    def ptr(self, b, k, ty):
        return b.inttoptr(self.slot(b, k), ty.as_pointer())


def build_entry(ctx, target):
    module, thread_fn = ctx.module, ctx.function
    name = thread_fn.name[: -len(".thread")]
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I8P, I64.as_pointer(), I64, I64]),
                     name)
    args_ptr, ctx_ptr, begin, end = fn.args
    ctx.target_data["entry_name"] = name
    e = Entry(fn, ctx_ptr)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    dims = [e.slot(b, abi.GRID + k) for k in range(3)]
    bdims = [e.slot(b, abi.BLOCK + k) for k in range(3)]
    nt = b.mul(b.mul(bdims[0], bdims[1]), bdims[2])
    coroutine = bool(ctx.target_data.get("coroutine"))
    if "cluster_together" in ctx.uses:
        yields = bool(ctx.target_data.get("yields"))
        cluster_entry(b, e, thread_fn, args_ptr, begin, end, dims, bdims, nt,
                      yields or bool(ctx.target_data.get("mbarrier_wait")), yields,
                      ctx.target_data.get("reg_pool"))
        return
    pool = ctx.target_data.get("reg_pool")
    with Loop(b, begin, end, "blk") as blk:
        if pool is not None:
            reset_register_pool(b, e, pool, ir.Constant(I64, 0))
        bx = b.trunc(b.urem(blk, dims[0]), I32)
        by = b.trunc(b.urem(b.udiv(blk, dims[0]), dims[1]), I32)
        bz = b.trunc(b.udiv(blk, b.mul(dims[0], dims[1])), I32)
        with Loop(b, ir.Constant(I64, 0), nt, "t") as t:
            tx = b.trunc(b.urem(t, bdims[0]), I32)
            ty = b.trunc(b.urem(b.udiv(t, bdims[0]), bdims[1]), I32)
            tz = b.trunc(b.udiv(t, b.mul(bdims[0], bdims[1])), I32)
            h = b.call(thread_fn, [args_ptr, ctx_ptr, tx, ty, tz, bx, by, bz, b.trunc(t, I32)])
            if coroutine:
                handles = e.ptr(b, abi.HANDLES_PTR, I8P)
                b.store(h, b.gep(handles, [t]))
                b.store(ir.Constant(I32, 0), b.gep(e.ptr(b, abi.STATE_PTR, I32), [t]))
        if coroutine:
            waits = bool(ctx.target_data.get("mbarrier_wait"))
            b.call(scheduler(module, waits), [ctx_ptr, nt])
            d = coro_decls(module)
            with Loop(b, ir.Constant(I64, 0), nt, "d") as t:
                b.call(d["destroy"], [b.load(b.gep(e.ptr(b, abi.HANDLES_PTR, I8P), [t]))])
        err = b.icmp_signed("!=", e.slot(b, abi.ERROR_CODE), ir.Constant(I64, 0))
        with b.if_then(err):
            b.store(blk, b.gep(ctx_ptr, [ir.Constant(I64, abi.ERROR_BLOCK)]))
            b.ret_void()
    b.ret_void()


def reset_register_pool(b, e, offset: int, rank):
    """Block `rank` of the cluster (0 without one) starts with an empty setmaxnreg pool
    (cpu_regs.py: 8 bytes at `offset` past its dynamic shared memory)."""
    base = b.add(b.add(e.slot(b, abi.SHARED_PTR), b.mul(rank, e.slot(b, abi.SHARED_STRIDE))),
                 e.slot(b, abi.DYN_BYTES))
    b.store(ir.Constant(I64, 0),
            b.inttoptr(b.add(base, ir.Constant(I64, offset)), I64.as_pointer()))


def cluster_entry(b, e, thread_fn, args_ptr, begin, end, dims, bdims, nt, waits, yields,
                  pool=None):
    """Clusters [begin, end) of the grid: create the coroutines of all of a cluster's blocks
    (block r's threads at r * nt of the handle and state arrays), run them with
    cluster_scheduler, destroy them. pool: the setmaxnreg pool's offset (None: no
    setmaxnreg), emptied for each block."""
    cdims = [e.slot(b, abi.CLUSTER + k) for k in range(3)]
    csize = b.mul(b.mul(cdims[0], cdims[1]), cdims[2])
    across = [b.udiv(dims[k], cdims[k]) for k in range(2)]     # clusters along x, y
    module = b.module
    with Loop(b, begin, end, "cl") as c:
        cc = [b.urem(c, across[0]), b.urem(b.udiv(c, across[0]), across[1]),
              b.udiv(c, b.mul(across[0], across[1]))]
        with Loop(b, ir.Constant(I64, 0), b.mul(csize, nt), "ct") as i:
            r, t = b.udiv(i, nt), b.urem(i, nt)
            rr = [b.urem(r, cdims[0]), b.urem(b.udiv(r, cdims[0]), cdims[1]),
                  b.udiv(r, b.mul(cdims[0], cdims[1]))]
            bid = [b.trunc(b.add(b.mul(cc[k], cdims[k]), rr[k]), I32) for k in range(3)]
            if pool is not None:
                with b.if_then(b.icmp_unsigned("==", t, ir.Constant(I64, 0))):
                    reset_register_pool(b, e, pool, r)
            tid = [b.trunc(b.urem(t, bdims[0]), I32),
                   b.trunc(b.urem(b.udiv(t, bdims[0]), bdims[1]), I32),
                   b.trunc(b.udiv(t, b.mul(bdims[0], bdims[1])), I32)]
            h = b.call(thread_fn, [args_ptr, e.ctx_ptr] + tid + bid + [b.trunc(t, I32)])
            b.store(h, b.gep(e.ptr(b, abi.HANDLES_PTR, I8P), [i]))
            b.store(ir.Constant(I32, 0), b.gep(e.ptr(b, abi.STATE_PTR, I32), [i]))
        b.call(cluster_scheduler(module, waits, yields), [e.ctx_ptr, nt, csize])
        d = coro_decls(module)
        with Loop(b, ir.Constant(I64, 0), b.mul(csize, nt), "d") as i:
            b.call(d["destroy"], [b.load(b.gep(e.ptr(b, abi.HANDLES_PTR, I8P), [i]))])
        err = b.icmp_signed("!=", e.slot(b, abi.ERROR_CODE), ir.Constant(I64, 0))
        with b.if_then(err):
            b.store(b.mul(c, csize), b.gep(e.ctx_ptr, [ir.Constant(I64, abi.ERROR_BLOCK)]))
            b.ret_void()
    b.ret_void()


def cluster_scheduler(module, waits: bool, yields: bool = False):
    """`void __pk_schedule_cluster(i64* ctx, i64 nthreads, i64 blocks)`: run each block of the
    cluster (the handle, state and shared-memory slots pointed at its part) until its threads
    have finished or wait at a cluster_sync; when every waiting thread is at the same one,
    release them all and go round again. yields (pk.nanosleep: the cluster is the grid): a
    block whose threads only spin hands over to the next, and rounds repeat while threads
    spin (spin_round)."""
    name = "__pk_schedule_cluster"
    fn = module.globals.get(name)
    if fn is not None:
        return fn
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64.as_pointer(), I64, I64]), name)
    fn.linkage = "internal"
    ctx_ptr, nt, csize = fn.args
    e = Entry(fn, ctx_ptr)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    # each block its own handles, states, shared memory and warp-exchange words
    slots = (abi.HANDLES_PTR, abi.STATE_PTR, abi.SHARED_PTR, abi.EXCHANGE_PTR)
    bases = [e.slot(b, k) for k in slots]
    steps = [b.mul(nt, ir.Constant(I64, 8)), b.mul(nt, ir.Constant(I64, 4)),
             e.slot(b, abi.SHARED_STRIDE), b.mul(nt, ir.Constant(I64, 2 * 16 * 8))]

    def point(r):
        for k, base, step in zip(slots, bases, steps):
            b.store(b.add(base, b.mul(r, step)), b.gep(ctx_ptr, [ir.Constant(I64, k)]))
    block_schedule = scheduler(module, waits, cluster=True, yields=yields)
    idle = entry_alloca(fn, I64)
    b.position_at_end(b.block)     # the alloca went in above b's insertion point
    b.store(ir.Constant(I64, 0), idle)
    rounds = fn.append_basic_block("round")
    b.branch(rounds)
    b.position_at_end(rounds)
    start = e.slot(b, abi.PROGRESS)
    with Loop(b, ir.Constant(I64, 0), csize, "r") as r:
        point(r)
        b.call(block_schedule, [ctx_ptr, nt])
        with b.if_then(b.icmp_signed("!=", e.slot(b, abi.ERROR_CODE), ir.Constant(I64, 0))):
            point(ir.Constant(I64, 0))
            b.ret_void()
    point(ir.Constant(I64, 0))
    state = e.ptr(b, abi.STATE_PTR, I32)
    total = b.mul(nt, csize)
    if yields:
        spin_round(b, e, state, total, start, idle, rounds)
    first, mismatch, waiting = scan(b, state, ir.Constant(I64, 0), total, abi.AT_CLUSTER)
    # a thread that finished can never arrive: strict, since the GPU may wait for it forever
    _, _, finished = scan(b, state, ir.Constant(I64, 0), total, abi.FINISHED)
    mismatch = b.or_(mismatch, b.icmp_signed("!=", finished, ir.Constant(I64, 0)))
    release_or_fail(b, ctx_ptr, state, total, abi.AT_CLUSTER, 8, first, mismatch, waiting,
                    rounds)
    return fn


def spin_round(b, e, state, total, start, idle, rounds):
    """After a round over a grid's blocks: threads still waiting (spin waits, mbarriers) go
    round again; 65536 rounds in a row in which no thread got further is a deadlock (the
    count, not the first such round: a spin on a timer gets further only once time passes)."""
    fn = b.function
    first, _, waiting = scan(b, state, ir.Constant(I64, 0), total, abi.WAITING)
    wait_bb, clear_bb = fn.append_basic_block("spin.wait"), fn.append_basic_block("spin.clear")
    b.cbranch(b.icmp_signed("!=", waiting, ir.Constant(I64, 0)), wait_bb, clear_bb)
    b.position_at_end(wait_bb)
    progressed = b.icmp_signed("!=", e.slot(b, abi.PROGRESS), start)
    count = b.select(progressed, ir.Constant(I64, 0),
                     b.add(b.load(idle), ir.Constant(I64, 1)))
    b.store(count, idle)
    stuck_bb = fn.append_basic_block("spin.stuck")
    b.cbranch(b.icmp_signed(">=", count, ir.Constant(I64, 1 << 16)), stuck_bb, rounds)
    b.position_at_end(stuck_bb)
    report_stuck(b, e, state, total, abi.SPIN_DEADLOCK, first)
    b.ret_void()
    b.position_at_end(clear_bb)


def scheduler(module, waits: bool = False, cluster: bool = False, yields: bool = False):
    """`void __pk_schedule(i64* ctx, i64 nthreads)`: run one block's coroutines to the end.
    waits: the kernel has mbarrier waits (threads suspended AT_MBARRIER are retried while the
    block makes progress; a round without progress is a deadlock). cluster: it also returns
    when every thread has finished or waits at a cluster_sync (AT_CLUSTER), and a thread at
    a syncthreads while another is at a cluster_sync is divergence. yields: a thread that
    went on to another state counts as progress, and a block whose waiting threads stopped
    progressing returns (the cluster scheduler runs the other blocks, whose writes they
    wait for) instead of reporting a deadlock."""
    name = "__pk_schedule" + ("_block" if cluster else "")
    fn = module.globals.get(name)
    if fn is not None:
        return fn
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64.as_pointer(), I64]), name)
    fn.linkage = "internal"
    ctx_ptr, nt = fn.args
    e, d = Entry(fn, ctx_ptr), coro_decls(module)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    handles, state = e.ptr(b, abi.HANDLES_PTR, I8P), e.ptr(b, abi.STATE_PTR, I32)
    nwarps = b.udiv(b.add(nt, ir.Constant(I64, 31)), ir.Constant(I64, 32))
    phase = fn.append_basic_block("phase")
    b.branch(phase)
    b.position_at_end(phase)
    before = e.slot(b, abi.PROGRESS)
    with Loop(b, ir.Constant(I64, 0), nwarps, "w") as w:
        lo = b.mul(w, ir.Constant(I64, 32))
        hi = b.select(b.icmp_signed("<", b.add(lo, ir.Constant(I64, 32)), nt),
                      b.add(lo, ir.Constant(I64, 32)), nt)
        run_warp(b, fn, e, d, handles, state, lo, hi, waits, cluster, yields)
    if waits:
        retry_blocked(b, fn, e, state, nt, before, phase, yields)
    # Every thread is at a barrier or finished: check they agree, release them, repeat.
    first, mismatch, waiting = scan(b, state, ir.Constant(I64, 0), nt, abi.AT_BARRIER)
    _, _, finished = scan(b, state, ir.Constant(I64, 0), nt, abi.FINISHED)
    partial = b.and_(b.icmp_signed("!=", finished, ir.Constant(I64, 0)),
                     b.icmp_signed("!=", waiting, ir.Constant(I64, 0)))
    with b.if_then(partial, likely=False):      # threads that returned never arrive
        record_error(b, ctx_ptr, abi.BARRIER_AFTER_RETURN, first)
        b.ret_void()
    if cluster:
        _, _, at_cluster = scan(b, state, ir.Constant(I64, 0), nt, abi.AT_CLUSTER)
        mismatch = b.or_(mismatch, b.icmp_signed("!=", at_cluster, ir.Constant(I64, 0)))
    release_or_fail(b, ctx_ptr, state, nt, abi.AT_BARRIER, 2, first, mismatch, waiting, phase)
    return fn


def release_or_fail(b, ctx_ptr, state, nt, kind, code, first, mismatch, waiting, again):
    """After a round: no thread waiting at `kind` -> return (all done); waiting at different
    sites -> record error `code` at the first one and return; else release them and branch
    to `again`."""
    fn = b.function
    done_bb, check_bb = fn.append_basic_block("done"), fn.append_basic_block("check")
    b.cbranch(b.icmp_signed("==", waiting, ir.Constant(I64, 0)), done_bb, check_bb)
    b.position_at_end(check_bb)
    bad_bb, release_bb = fn.append_basic_block("diverged"), fn.append_basic_block("release")
    b.cbranch(mismatch, bad_bb, release_bb)
    b.position_at_end(bad_bb)
    record_error(b, ctx_ptr, code, first)
    b.ret_void()
    b.position_at_end(release_bb)
    release(b, state, ir.Constant(I64, 0), nt, kind)
    b.branch(again)
    b.position_at_end(done_bb)
    b.ret_void()


def run_warp(b, fn, e, d, handles, state, lo, hi, waits=False, cluster=False, yields=False):
    """Resume the warp's lanes until none runs; lanes at one warp operation are released
    together. A warp split between a warp operation and a block (or, cluster, a cluster)
    barrier is divergence (error 3): the GPU would hang or run the operation without them."""
    again = fn.append_basic_block("warp.again")
    b.branch(again)
    b.position_at_end(again)
    before = e.slot(b, abi.PROGRESS)
    with Loop(b, lo, hi, "lane") as t:
        s = b.load(b.gep(state, [t]))
        running = b.icmp_signed("==", s, ir.Constant(I32, abi.RUNNING))
        if waits:
            with b.if_then(running):
                bump_progress(b, e)
            kind = b.lshr(s, ir.Constant(I32, 24))
            waiting = b.or_(b.icmp_unsigned("==", kind, ir.Constant(I32, abi.AT_MBARRIER)),
                            b.icmp_unsigned("==", kind, ir.Constant(I32, abi.AT_REGISTERS)))
            running = b.or_(running, waiting)
        with b.if_then(running):
            b.call(d["resume"], [b.load(b.gep(handles, [t]))])
            if yields:     # a spin's thread back at its nanosleep got nowhere
                with b.if_then(b.icmp_unsigned("!=", b.load(b.gep(state, [t])), s)):
                    bump_progress(b, e)
    first, mismatch, at_warp = scan(b, state, lo, hi, abi.AT_WARP_OP)
    _, _, at_barrier = scan(b, state, lo, hi, abi.AT_BARRIER)
    exit_bb, more_bb = fn.append_basic_block("warp.exit"), fn.append_basic_block("warp.more")
    b.cbranch(b.icmp_signed("==", at_warp, ir.Constant(I64, 0)), exit_bb, more_bb)
    b.position_at_end(more_bb)
    split = b.or_(mismatch, b.icmp_signed("!=", at_barrier, ir.Constant(I64, 0)))
    if cluster:
        _, _, at_cluster = scan(b, state, lo, hi, abi.AT_CLUSTER)
        split = b.or_(split, b.icmp_signed("!=", at_cluster, ir.Constant(I64, 0)))
    bad_bb, ok_bb = fn.append_basic_block("warp.diverged"), fn.append_basic_block("warp.ok")
    b.cbranch(split, bad_bb, ok_bb)
    b.position_at_end(bad_bb)
    record_error(b, e.ctx_ptr, 3, first)
    b.ret_void()
    b.position_at_end(ok_bb)
    if waits:
        # lanes at the warp operation wait for lanes still at an mbarrier wait: retry those
        # while they progress, else leave the warp to the other warps
        _, _, at_wait = scan(b, state, lo, hi, abi.WAITING)
        blocked_bb, release_bb = (fn.append_basic_block("warp." + n)
                                  for n in ("blocked", "release"))
        b.cbranch(b.icmp_signed("!=", at_wait, ir.Constant(I64, 0)), blocked_bb, release_bb)
        b.position_at_end(blocked_bb)
        progressed = b.icmp_signed("!=", e.slot(b, abi.PROGRESS), before)
        b.cbranch(progressed, again, exit_bb)
        b.position_at_end(release_bb)
    release(b, state, lo, hi, abi.AT_WARP_OP)
    b.branch(again)
    b.position_at_end(exit_bb)


def retry_blocked(b, fn, e, state, nt, before, phase, yields=False):
    """After a round over the warps: threads still at an mbarrier wait (or at a warp
    operation their warp's waiting lanes hold up) get another round if this one progressed;
    otherwise nothing can free them: a deadlock."""
    first, _, at_wait = scan(b, state, ir.Constant(I64, 0), nt, abi.WAITING)
    blocked_bb, clear_bb = fn.append_basic_block("blocked"), fn.append_basic_block("clear")
    b.cbranch(b.icmp_signed("!=", at_wait, ir.Constant(I64, 0)), blocked_bb, clear_bb)
    b.position_at_end(blocked_bb)
    stuck_bb = fn.append_basic_block("deadlock")
    b.cbranch(b.icmp_signed("!=", e.slot(b, abi.PROGRESS), before), phase, stuck_bb)
    b.position_at_end(stuck_bb)
    if not yields:      # yields: another block may free them (cluster_scheduler's spin_round)
        report_stuck(b, e, state, nt, 6, first)
    b.ret_void()
    b.position_at_end(clear_bb)


def report_stuck(b, e, state, nt, code, first):
    """A block (or grid) whose waiting threads stopped progressing: error 17 at the first
    setmaxnreg.inc still waiting for registers (the cause: the warps it waits for are stuck
    behind it), else error `code` at `first`."""
    regs_first, _, at_regs = scan(b, state, ir.Constant(I64, 0), nt, abi.AT_REGISTERS)
    stuck = b.icmp_signed("!=", at_regs, ir.Constant(I64, 0))
    record_error(b, e.ctx_ptr, b.select(stuck, ir.Constant(I64, abi.SETMAXNREG_STUCK),
                                        ir.Constant(I64, code)),
                 b.select(stuck, regs_first, first))
