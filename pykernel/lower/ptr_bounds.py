"""Bounds that travel with a pointer value chosen at run time, for targets that check accesses
(the CPU target always, NVPTX with bounds_check).

A pointer's `origin` names the memory it points into at compile time: ("param", k), a shared or
constant array ("array", ptr, nbytes), a dynamic-shared range ("range", ptr, nbytes). When the
pointer is chosen at run time among several (a variable bound at more than one place, a
conditional expression, a @pk.func with several `return`s) one compile-time origin is wrong for
some of the choices, so the bounds become runtime values: ("bounds", base i8*, nbytes i64),
computed by the target where each choice is made (`target.pointer_bounds`) and carried through
companion slots (variables, returns) or phis (conditional expressions). An origin the target
cannot bound (None) becomes an unbounded range, as an unchecked pointer is today."""
from __future__ import annotations

from llvmlite import ir

I8P, I64 = ir.IntType(8).as_pointer(), ir.IntType(64)
UNBOUNDED = 1 << 62          # bytes from address 0: covers every address, never overflows


def tracks(fl) -> bool:
    """Whether this compilation checks accesses, so origins must be right at run time."""
    return fl.ctx.target.tracks_pointer_bounds(fl.ctx)


def same_origin(a, b) -> bool:
    """Compile-time equal origins: same kind, same IR values (by identity), same sizes."""
    if a is None or b is None:
        return a is b
    if len(a) != len(b):
        return False
    return all(x is y if isinstance(x, ir.Value) or isinstance(y, ir.Value) else x == y
               for x, y in zip(a, b))


def bounds_of(fl, origin):
    """(base i8*, nbytes i64) of `origin`, computed at the builder's position."""
    got = None if origin is None else fl.ctx.target.pointer_bounds(fl.ctx, origin)
    if got is None:
        return ir.Constant(I8P, None), ir.Constant(I64, UNBOUNDED)
    return got


class BoundSlots:
    """The companion stack slots of a pointer chosen at run time: its base and byte size."""

    def __init__(self, fl, name: str):
        self.base = fl.ctx.alloca(I8P, f"{name}.base")
        self.nbytes = fl.ctx.alloca(I64, f"{name}.nbytes")

    def store(self, fl, origin):
        base, nbytes = bounds_of(fl, origin)
        fl.b.store(base, self.base)
        fl.b.store(nbytes, self.nbytes)

    def load(self, fl):
        return ("bounds", fl.b.load(self.base), fl.b.load(self.nbytes))


def slot_origin(fl, entry):
    """The origin of a pointer read from a variable: its static origin, or its bound slots'."""
    return entry.load(fl) if isinstance(entry, BoundSlots) else entry


def branch_bounds(fl, val, other):
    """At the end of one branch of a conditional expression: the bounds of `val` when the two
    branches' pointers come from different memory (None when no phi is needed)."""
    if not tracks(fl) or same_origin(val.origin, other.origin):
        return None
    return bounds_of(fl, val.origin)


def phi_origin(fl, then_bounds, then_end, else_bounds, else_end):
    """The origin of the merged pointer, at the start of the join block."""
    base, nbytes = fl.b.phi(I8P), fl.b.phi(I64)
    for phi, a, c in ((base, then_bounds[0], else_bounds[0]),
                      (nbytes, then_bounds[1], else_bounds[1])):
        phi.add_incoming(a, then_end)
        phi.add_incoming(c, else_end)
    return ("bounds", base, nbytes)


def _static(origin) -> bool:
    """An origin that holds no instruction, so it is valid anywhere in the kernel."""
    return origin is not None and all(
        not isinstance(x, ir.Value) or isinstance(x, (ir.Constant, ir.GlobalValue))
        for x in origin)


class ReturnBounds:
    """The origin a device function's `return`s give one pointer result: the static origin
    when every return agrees on one valid anywhere, else the runtime bounds each return stored
    (None, unchecked, where the target does not check accesses)."""

    def __init__(self, fl):
        self.slots = BoundSlots(fl, "ret") if tracks(fl) else None
        self.origins = []

    def store(self, fl, origin):
        self.origins.append(origin)
        if self.slots is not None:
            self.slots.store(fl, origin)

    def origin(self, fl):
        if self.slots is None:
            return None
        first = self.origins[0]
        if _static(first) and all(same_origin(first, o) for o in self.origins[1:]):
            return first
        return self.slots.load(fl)
