"""Timers and sleeping: `pk.clock64()`, `pk.globaltimer()`, `pk.nanosleep(ns)`. On the GPU the
special registers %clock64 / %globaltimer and `nanosleep.u32`; on the CPU target clock_gettime
nanoseconds, and nanosleep is a yield to the grid's other threads (targets/cpu_collectives.py). Input: call nodes; output: Values."""
from __future__ import annotations

from ..lower.values import ConstValue, Value, describe
from ..types import i32, i64, u32, u64
from .base import args_of, intrinsic


@intrinsic("clock64")
def clock64(fl, node):
    """`pk.clock64()` -> i64: the SM's cycle counter (`mov.u64 %clock64`); CPU target:
    monotonic nanoseconds."""
    args_of(fl, node, 0, "clock64")
    return Value(i64, fl.ctx.target.lower_intrinsic("timer", fl, node, "clock64"))


@intrinsic("globaltimer")
def globaltimer(fl, node):
    """`pk.globaltimer()` -> u64: a nanosecond timer shared by the GPU
    (`mov.u64 %globaltimer`); CPU target: CLOCK_REALTIME nanoseconds."""
    args_of(fl, node, 0, "globaltimer")
    return Value(u64, fl.ctx.target.lower_intrinsic("timer", fl, node, "globaltimer"))


@intrinsic("nanosleep")
def nanosleep(fl, node):
    """`pk.nanosleep(ns)`: suspend the thread for about ns nanoseconds, at most 1 ms
    (`nanosleep.u32`, sm_70+); on the CPU target a yield, so that spin waits on other
    blocks' writes finish (docs/language.md, "Memory order")."""
    (ns,), _ = args_of(fl, node, 1, "nanosleep")
    fl.ctx.require_arch(70, "nanosleep.u32", fl, node)
    ns = fl.coerce(ns, u32, node) if isinstance(ns, ConstValue) else ns
    if not isinstance(ns, Value) or ns.ty not in (i32, u32):
        raise fl.error(node, f"pk.nanosleep takes an i32 or u32, got {describe(ns)}")
    fl.ctx.target.lower_intrinsic("nanosleep", fl, node, ns.ir)
    return ConstValue(None)
