"""Warp and block collectives beyond shuffles and votes: `pk.activemask`, `pk.match_any`,
`pk.match_all`, `pk.redux_sync` (warp) and `pk.syncthreads_count / _and / _or` (block). The
arguments are checked here; the instructions come from the target's table
(targets/nvptx_intrinsics.py; the CPU target emulates them exactly in
targets/cpu_collectives.py). Input: call nodes; output: Values."""
from __future__ import annotations

from llvmlite import ir

from ..lower.values import ConstValue, TupleValue, Value, describe
from ..types import bool_, f32, f64, i32, i64, u32, u64
from .base import args_of, intrinsic

MATCH_TYPES = (i32, u32, i64, u64, f32, f64)
REDUX_OPS = ("add", "min", "max", "and", "or", "xor")


def _mask(fl, node, mask):
    return fl.coerce(mask, u32, node).ir


@intrinsic("activemask")
def activemask(fl, node):
    """`pk.activemask()` -> u32: the lanes of this warp executing this call together
    (`activemask.b32`)."""
    args_of(fl, node, 0, "activemask")
    fl.ctx.uses.add("warp")
    return Value(u32, fl.ctx.target.lower_intrinsic("activemask", fl, node))


def _match_operand(fl, node, value, name):
    value = fl.materialize(value, node)
    if not isinstance(value, Value) or value.ty not in MATCH_TYPES:
        raise fl.error(node, f"pk.{name} compares i32 / u32 / i64 / u64 / f32 / f64 values, "
                       f"got {describe(value)}")
    if value.ty.is_float:     # compared bit for bit, as CUDA does
        return fl.b.bitcast(value.ir, ir.IntType(value.ty.bits))
    return value.ir


def _match(kind):
    name = f"match_{kind}"

    def lower(fl, node):
        (mask, value), _ = args_of(fl, node, 2, name)
        fl.ctx.require_arch(70, f"match.{kind}.sync", fl, node)
        m = _mask(fl, node, mask)
        v = _match_operand(fl, node, value, name)
        fl.ctx.uses.add("warp")
        res = fl.ctx.target.lower_intrinsic("match", fl, node, kind, m, v)
        if kind == "any":
            return Value(u32, res)
        return TupleValue((Value(u32, res[0]), Value(bool_, res[1])))
    lower.__doc__ = (
        "`pk.match_any(mask, v)` -> u32: the lanes of mask whose v equals this lane's "
        "(`match.any.sync.b32/.b64`, sm_70+)." if kind == "any" else
        "`m, same = pk.match_all(mask, v)`: (mask, True) when every lane of mask has this "
        "lane's v, else (0, False) (`match.all.sync.b32/.b64`, sm_70+).")
    return intrinsic(name)(lower)


match_any = _match("any")
match_all = _match("all")


@intrinsic("redux_sync")
def redux_sync(fl, node):
    """`pk.redux_sync(op, mask, v)`: op ("add", "min", "max", "and", "or", "xor") over v of
    the lanes in mask, the same result in each (`redux.sync.<op>.{u32,s32,b32}`, sm_80+);
    v i32 (signed min / max) or u32; the sum wraps."""
    (op, mask, value), _ = args_of(fl, node, 3, "redux_sync")
    if not isinstance(op, ConstValue) or op.value not in REDUX_OPS:
        raise fl.error(node, f"pk.redux_sync's first argument is one of "
                       f"{', '.join(map(repr, REDUX_OPS))}")
    fl.ctx.require_arch(80, f"redux.sync.{op.value} (pk.redux_sync)", fl, node)
    value = fl.coerce(value, i32, node) if isinstance(value, ConstValue) else value
    if not isinstance(value, Value) or value.ty not in (i32, u32):
        raise fl.error(node, f"pk.redux_sync reduces i32 or u32, got {describe(value)}",
                       hint="convert explicitly, e.g. u32(x)")
    fl.ctx.uses.add("warp")
    res = fl.ctx.target.lower_intrinsic("redux", fl, node, op.value, value.ty is i32,
                                        _mask(fl, node, mask), value.ir)
    return Value(value.ty, res)


def _barrier_reduce(op, name, what):
    def lower(fl, node):
        (pred,), _ = args_of(fl, node, 1, name)
        p = fl.truth(pred, node)
        fl.ctx.uses.add("barrier")
        site = fl.ctx.site(fl, node, name)
        return Value(i32, fl.ctx.target.lower_intrinsic("barrier_reduce", fl, node, op, p,
                                                        site))
    lower.__doc__ = (f"`pk.{name}(p)` -> i32: block barrier (as pk.syncthreads) that returns "
                     f"{what} (`bar.red.{op}`).")
    return intrinsic(name)(lower)


syncthreads_count = _barrier_reduce("popc", "syncthreads_count",
                                    "how many threads of the block had p true")
syncthreads_and = _barrier_reduce("and", "syncthreads_and", "1 if p was true in every thread")
syncthreads_or = _barrier_reduce("or", "syncthreads_or", "1 if p was true in any thread")
