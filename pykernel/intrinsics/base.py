"""The Intrinsic object: a name users call inside kernels and its lowering function."""
from __future__ import annotations

from numbers import Integral

from ..lower.values import ConstValue


class Intrinsic:
    def __init__(self, name: str, lower, doc: str = ""):
        self.name, self._lower, self.__doc__ = name, lower, doc

    def lower_call(self, fl, node):
        return self._lower(fl, node)

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"pk.{self.name}() can only be called inside a @pk.kernel or "
                           "@pk.func")

    def __repr__(self) -> str:
        return f"<pykernel intrinsic pk.{self.name}>"


def intrinsic(name: str):
    def wrap(fn):
        return Intrinsic(name, fn, fn.__doc__ or "")
    return wrap


def args_of(fl, node, count, name, keywords=()):
    """Evaluate positional args (count: int or (min, max)) and allowed keywords."""
    lo, hi = (count, count) if isinstance(count, int) else count
    if not lo <= len(node.args) <= hi:
        want = lo if lo == hi else f"{lo} to {hi}"
        raise fl.error(node, f"pk.{name}() takes {want} arguments, got {len(node.args)}")
    kwargs = {}
    for kw in node.keywords:
        if kw.arg not in keywords:
            raise fl.error(node, f"pk.{name}() got an unexpected keyword '{kw.arg}'")
        kwargs[kw.arg] = fl.expr(kw.value)
    return [fl.expr(a) for a in node.args], kwargs


def target_statement(name: str, min_sm: int, instruction: str, doc: str) -> Intrinsic:
    """`pk.<name>()`: no operands, no value; sm_<min_sm>+ for `instruction`, then the target's
    method of the same name emits it (the commits and fences of the asynchronous copies)."""
    def lower(fl, node):
        args_of(fl, node, 0, name)
        fl.ctx.require_arch(min_sm, instruction, fl, node)
        getattr(fl.ctx.target, name)(fl.ctx)
        return ConstValue(None)
    return Intrinsic(name, lower, doc)


def groups_in_flight(fl, node, name: str, limit: int) -> int:
    """The `n` of a `pk.<name>(n)` wait: a compile-time int 0..limit - 1, the committed groups
    that may still be in flight when the wait returns."""
    (count,), _ = args_of(fl, node, 1, name)
    value = count.value if isinstance(count, ConstValue) else None
    if isinstance(value, bool) or not isinstance(value, Integral) or value not in range(limit):
        raise fl.error(node.args[0], f"pk.{name}: n must be a compile-time int 0..{limit - 1} "
                       "(the groups left in flight)")
    return int(value)
