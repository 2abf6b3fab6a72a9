"""The CPU target's forms of activemask, match, redux (warp), the barrier reductions
(syncthreads_count / _and / _or) and the timers. Input: operands intrinsics/collectives.py and
timing.py checked; output: IR values.

Warp operations publish a flag word (PRESENT) and their value through the warp-exchange slots
(cpu_ops.exchange_words); a lane that returned has cleared its flag for the warp's next
operation (CPUTarget._finish_coroutine), so a lane reads exactly which lanes take part.
Barrier reductions publish a tagged word per thread (layout below), wait at the block barrier,
and each thread sums the words that carry its own tag."""
from __future__ import annotations

from llvmlite import ir

from . import cpu_abi as abi
from .cpu_ops import CPUOps
from .cpu_thread_state import Loop

I1, I32, I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
PRESENT = CPUOps.PRESENT    # flag-word bit: this lane takes part (bit 0: vote's predicate)
# Barrier-reduction word (i64), words BAR_WORD + (n & 1) of a thread's half-0 exchange slot
# (warp operations use words 0..9): block linear index << 32 | n << 1 | predicate, n = this
# thread's count of barrier reductions (from 1; 0 = none, written when the thread starts).
BAR_WORD = 14


def _lane_base(fl):
    tlin = fl.ctx.target_data["tlin"]
    return fl.b.sub(tlin, fl.b.and_(tlin, ir.Constant(I32, 31)))


def _gather(fl, node, kind: str, value=None, mask=None):
    """Publish (PRESENT, value), wait for the warp; per lane: (takes part: i1, its value).
    A lane takes part unless it has returned (its exchange words are then stale); with a
    mask, naming a lane that returned is an error (target.check_warp_mask)."""
    target, b = fl.ctx.target, fl.b
    site = fl.ctx.site(fl, node, kind)
    words = [ir.Constant(I64, PRESENT)]
    if value is not None:
        words.append(b.zext(value, I64) if value.type != I64 else value)
    slots, half, nt = target.exchange_words(fl.ctx, words, site)
    tlin, base = fl.ctx.target_data["tlin"], _lane_base(fl)
    lanes, exists = [], []
    for lane in range(32):      # unrolled, as vote: no loop blocks
        t = b.add(base, ir.Constant(I32, lane))
        live = b.icmp_signed("<", t, nt)
        safe = b.select(live, t, tlin)
        present = b.and_(live, target.lane_running(fl.ctx, safe))
        v = None
        if value is not None:
            v = target.fetch_word(fl.ctx, slots, half, safe, 1, width=value.type.width)
        lanes.append((present, v))
        exists.append(live)
    if mask is not None:
        target.check_warp_mask(fl.ctx, mask, _mask_of(b, [p for p, _ in lanes]),
                               _mask_of(b, exists), site)
    return lanes


def _mask_of(b, bits):
    out = ir.Constant(I32, 0)
    for lane, bit in enumerate(bits):
        out = b.or_(out, b.shl(b.zext(bit, I32), ir.Constant(I32, lane)))
    return out


def activemask(fl, node):
    return _mask_of(fl.b, [p for p, _ in _gather(fl, node, "activemask")])


def match(fl, node, kind: str, mask, value):
    b = fl.b
    lanes = _gather(fl, node, f"match_{kind}", value, mask)
    same = _mask_of(b, [b.and_(p, b.icmp_unsigned("==", v, value)) for p, v in lanes])
    if kind == "any":
        return b.and_(same, mask)
    present = _mask_of(b, [p for p, _ in lanes])
    ok = b.icmp_unsigned("==", b.and_(same, mask), b.and_(present, mask))
    return b.select(ok, mask, ir.Constant(I32, 0)), ok


IDENTITY = {"add": 0, "and": -1, "or": 0, "xor": 0}


def redux(fl, node, op: str, signed: bool, mask, value):
    b = fl.b
    lanes = _gather(fl, node, f"redux_sync {op}", value, mask)
    if op in IDENTITY:
        acc = ir.Constant(I32, IDENTITY[op])
    else:
        big = 0x7FFFFFFF if signed else -1
        acc = ir.Constant(I32, (~big if signed else 0) if op == "max" else big)
    for lane, (present, v) in enumerate(lanes):
        chosen = b.icmp_unsigned("!=", b.and_(mask, ir.Constant(I32, 1 << lane)),
                                 ir.Constant(I32, 0))
        if op in IDENTITY:
            combined = {"add": b.add, "and": b.and_, "or": b.or_, "xor": b.xor}[op](acc, v)
        else:
            cmp = b.icmp_signed if signed else b.icmp_unsigned
            combined = b.select(cmp("<" if op == "min" else ">", v, acc), v, acc)
        acc = b.select(b.and_(present, chosen), combined, acc)
    return acc


def _bar_slots(fl):
    """The exchange slots as i64*, this thread's reduction counter, and (once per kernel) the
    thread's two reduction words cleared when it starts (stale words of an earlier block or
    launch on this worker never carry a live tag)."""
    ctx, td = fl.ctx, fl.ctx.target_data
    counter = td.get("bar_red_counter")
    if counter is None:
        counter = ctx.alloca(I32, "bar.red.count")
        entry = ir.IRBuilder(ctx.entry)
        entry.store(ir.Constant(I32, 0), counter)
        slots = entry.inttoptr(ctx.target.ctx_slot(ctx, abi.EXCHANGE_PTR, entry),
                               I64.as_pointer())
        mine = entry.mul(td["tlin"], ir.Constant(I32, ctx.target.SLOT_WORDS))
        for w in (BAR_WORD, BAR_WORD + 1):
            entry.store(ir.Constant(I64, 0), entry.gep(slots, [entry.add(mine,
                                                                      ir.Constant(I32, w))]))
        td["bar_red_counter"] = counter
    b = fl.b
    return b.inttoptr(ctx.target.ctx_slot(ctx, abi.EXCHANGE_PTR), I64.as_pointer()), counter


def _block_linear(fl):
    b, td, target = fl.b, fl.ctx.target_data, fl.ctx.target
    gx, gy = (b.trunc(target.ctx_slot(fl.ctx, abi.GRID + k), I32) for k in (0, 1))
    bx, by, bz = td["bid"]
    return b.add(bx, b.mul(gx, b.add(by, b.mul(gy, bz))))


def barrier_reduce(fl, node, op: str, pred, site):
    """Publish the tagged predicate, wait at the block barrier, then count the threads whose
    word carries this tag (the ones at this barrier) and those with the predicate set. Words
    alternate by the count's parity, so a thread already past the barrier and publishing its
    next reduction cannot overwrite one another thread has yet to read."""
    ctx, b = fl.ctx, fl.b
    slots, counter = _bar_slots(fl)
    n = b.add(b.load(counter), ir.Constant(I32, 1))
    b.store(n, counter)
    word = b.add(ir.Constant(I32, BAR_WORD), b.and_(n, ir.Constant(I32, 1)))
    tag = b.or_(b.shl(b.zext(_block_linear(fl), I64), ir.Constant(I64, 32)),
                b.zext(b.shl(n, ir.Constant(I32, 1)), I64))
    stride = ir.Constant(I32, ctx.target.SLOT_WORDS)
    mine = b.add(b.mul(ctx.target_data["tlin"], stride), word)
    b.store(b.or_(tag, b.zext(pred, I64)), b.gep(slots, [mine]))
    ctx.target.barrier(ctx, site)
    members, count = ctx.alloca(I32, "bar.red.members"), ctx.alloca(I32, "bar.red.count")
    b.store(ir.Constant(I32, 0), members)
    b.store(ir.Constant(I32, 0), count)
    slots = b.inttoptr(ctx.target.ctx_slot(ctx, abi.EXCHANGE_PTR), I64.as_pointer())
    with Loop(b, ir.Constant(I32, 0), ctx.target.block_threads(ctx), "bar.red") as t:
        w = b.load(b.gep(slots, [b.add(b.mul(t, stride), word)]))
        same = b.icmp_unsigned("==", b.and_(w, ir.Constant(I64, ~1)), tag)
        bit = b.and_(same, b.trunc(w, I1))
        b.store(b.add(b.load(members), b.zext(same, I32)), members)
        b.store(b.add(b.load(count), b.zext(bit, I32)), count)
    total, hits = b.load(members), b.load(count)
    if op == "popc":
        return hits
    ok = b.icmp_unsigned("==", hits, total) if op == "and" else \
        b.icmp_unsigned("!=", hits, ir.Constant(I32, 0))
    return b.zext(ok, I32)


CLOCK = {"clock64": 1, "globaltimer": 0}     # CLOCK_MONOTONIC, CLOCK_REALTIME (Linux, macOS)


def timer(fl, node, which: str):
    """Nanoseconds from clock_gettime: CLOCK_MONOTONIC for clock64 (not cycles),
    CLOCK_REALTIME for globaltimer."""
    b, m = fl.b, fl.ctx.module
    timespec = ir.LiteralStructType([I64, I64])
    fn = m.globals.get("clock_gettime") or ir.Function(
        m, ir.FunctionType(I32, [I32, timespec.as_pointer()]), "clock_gettime")
    ts = fl.ctx.alloca(timespec, "timespec")
    b.call(fn, [ir.Constant(I32, CLOCK[which]), ts])
    zero = ir.Constant(I32, 0)
    sec = b.load(b.gep(ts, [zero, zero]))
    nsec = b.load(b.gep(ts, [zero, ir.Constant(I32, 1)]))
    return b.add(b.mul(sec, ir.Constant(I64, 1_000_000_000)), nsec)


def nanosleep(fl, node, ns):
    """A yield, not a sleep: the thread suspends (AT_MBARRIER at this site) so that the
    others, of every block, run; the kernel's whole grid lives at once as one cluster of
    coroutines (runtime/cpu.py, cpu_spin.py). So a spin wait on what another block writes,
    with pk.nanosleep in its loop, cannot deadlock however few host threads run the grid."""
    ctx = fl.ctx
    ctx.uses.update(("cluster_together", "grid_resident"))
    ctx.target_data["yields"] = True
    ctx.target.suspend(ctx, abi.AT_MBARRIER, ctx.site(fl, node, "pk.nanosleep (spin wait)"))


INTRINSICS = {"activemask": activemask, "match": match, "redux": redux,
              "barrier_reduce": barrier_reduce, "timer": timer, "nanosleep": nanosleep}
