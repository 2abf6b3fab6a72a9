"""The Intrinsic object: a name users call inside kernels and its lowering function."""
from __future__ import annotations


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
