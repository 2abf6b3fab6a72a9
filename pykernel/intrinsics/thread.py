"""Thread model: thread/block indices and sizes, lane id, barriers, warp shuffles and votes."""
from __future__ import annotations

from llvmlite import ir

from ..types import ScalarType, bool_, i32, u32
from ..lower import ops
from ..lower.values import ConstValue, Value, describe
from .base import args_of, intrinsic

I32 = ir.IntType(32)


class Dim3Register:
    """`pk.thread_idx.x` etc.: i32 values read from special registers."""

    def __init__(self, which: str):
        self.which = which

    def lower_attr(self, fl, attr, node):
        if attr not in ("x", "y", "z"):
            raise fl.error(node, f"pk.{self.which} has fields x, y, z (not '{attr}')")
        return Value(i32, fl.ctx.target.special_register(fl.ctx, self.which, attr))

    def __repr__(self):
        return f"pk.{self.which}"


thread_idx = Dim3Register("thread_idx")
block_idx = Dim3Register("block_idx")
block_dim = Dim3Register("block_dim")
grid_dim = Dim3Register("grid_dim")
warp_size = 32


@intrinsic("lane_id")
def lane_id(fl, node):
    """This thread's lane within its warp (0..31): `%laneid`."""
    args_of(fl, node, 0, "lane_id")
    return Value(i32, fl.ctx.target.special_register(fl.ctx, "lane_id", None))


@intrinsic("syncthreads")
def syncthreads(fl, node):
    """Block-wide barrier: `bar.sync 0`."""
    args_of(fl, node, 0, "syncthreads")
    fl.ctx.uses.add("barrier")
    fl.ctx.target.barrier(fl.ctx, fl.ctx.site(fl, node, "syncthreads"))
    return ConstValue(None)


@intrinsic("threadfence")
def threadfence(fl, node):
    """Device-wide memory fence: `fence.sc.gpu` / `membar.gl`."""
    args_of(fl, node, 0, "threadfence")
    fl.ctx.target.fence(fl.ctx)
    return ConstValue(None)


@intrinsic("grid_dependency_wait")
def grid_dependency_wait(fl, node):
    """Wait until the previous kernel in the stream has finished and its writes are visible
    (`griddepcontrol.wait`, sm_90+; nothing on older GPUs and on the CPU target). Only
    meaningful in a kernel launched with PDL (pk.capture_graph(pdl=True)): code before it may
    run while the previous kernel is still running, so it must not read what that kernel
    writes or write what it reads (loading weights is the intended use)."""
    return _pdl_statement(fl, node, "grid_dependency_wait")


@intrinsic("launch_dependents")
def launch_dependents(fl, node):
    """Let the next kernel in the stream start launching now (`griddepcontrol.launch_dependents`,
    sm_90+; nothing elsewhere). Without it a kernel triggers after its body. Early triggers pay
    in kernels of one wave; the next kernel still waits for this one to finish before it reads
    anything (its own prologue), so the position never affects results."""
    return _pdl_statement(fl, node, "launch_dependents")


def _pdl_statement(fl, node, name):
    args_of(fl, node, 0, name)
    fl.ctx.uses.add(name)
    emit = getattr(fl.ctx.target, name, None)
    if emit is not None:
        emit(fl.ctx)
    return ConstValue(None)


def _mask(fl, kwargs, node):
    mask = kwargs.get("mask", ConstValue(0xFFFFFFFF))
    return fl.coerce(mask, u32, node).ir


def _shuffle(kind):
    def lower(fl, node):
        (value, lane), kwargs = args_of(fl, node, 2, f"shfl_{kind}", ("mask",))
        value = fl.materialize(value, node)
        if not isinstance(value, Value):
            raise fl.error(node, f"shuffles move scalars, got {describe(value)}")
        lane = fl.coerce(lane, i32, node) if not isinstance(lane, Value) or lane.ty is i32 \
            else lane
        if isinstance(lane, Value) and lane.ty is not i32:
            lane = Value(i32, ops.cast(fl.b, lane.ty, i32, lane.ir))
        mask = _mask(fl, kwargs, node)
        fl.ctx.uses.add("warp")
        site = fl.ctx.site(fl, node, f"shfl_{kind}")
        parts = _to_words(fl, value)
        out = [fl.ctx.target.shuffle(fl.ctx, kind, w, lane.ir, mask, site) for w in parts]
        return _from_words(fl, value.ty, out)
    lower.__doc__ = f"Warp shuffle ({kind}): `shfl.sync.{kind}.b32`, 64-bit values in two halves."
    return intrinsic(f"shfl_{kind}")(lower)


def _to_words(fl, value: Value):
    b, ty = fl.b, value.ty
    if ty.bits == 64:
        raw = b.bitcast(value.ir, ir.IntType(64)) if ty.is_float else value.ir
        return [b.trunc(raw, I32), b.trunc(b.lshr(raw, ir.Constant(ir.IntType(64), 32)), I32)]
    if ty.is_float and ty.bits == 32:
        return [b.bitcast(value.ir, I32)]
    raw = b.bitcast(value.ir, ir.IntType(16)) if ty.llvm == ir.HalfType() else value.ir
    if ty is bool_:
        raw = value.ir
    return [b.zext(raw, I32) if raw.type != I32 else raw]


def _from_words(fl, ty: ScalarType, words):
    b = fl.b
    if ty.bits == 64:
        lo, hi = (b.zext(w, ir.IntType(64)) for w in words)
        raw = b.or_(lo, b.shl(hi, ir.Constant(ir.IntType(64), 32)))
        return Value(ty, b.bitcast(raw, ty.llvm) if ty.is_float else raw)
    w = words[0]
    if ty.is_float and ty.bits == 32:
        return Value(ty, b.bitcast(w, ty.llvm))
    narrow = b.trunc(w, ir.IntType(ty.bits if ty is not bool_ else 1)) if ty.bits < 32 else w
    if ty.llvm == ir.HalfType():
        narrow = b.bitcast(narrow, ty.llvm)
    return Value(ty, narrow)


shfl_xor = _shuffle("bfly")
shfl_xor.name = "shfl_xor"
shfl_down = _shuffle("down")
shfl_up = _shuffle("up")
shfl_idx = _shuffle("idx")


def _vote(kind):
    def lower(fl, node):
        (pred,), kwargs = args_of(fl, node, 1, kind, ("mask",))
        p = fl.truth(pred, node)
        fl.ctx.uses.add("warp")
        site = fl.ctx.site(fl, node, kind)
        res = fl.ctx.target.vote(fl.ctx, kind, p, _mask(fl, kwargs, node), site)
        return Value(u32, res) if kind == "ballot" else Value(bool_, res)
    lower.__doc__ = f"Warp vote `{kind}`: `vote.sync.{kind}`."
    return intrinsic(kind)(lower)


ballot = _vote("ballot")
any_sync = _vote("any_sync")
all_sync = _vote("all_sync")
