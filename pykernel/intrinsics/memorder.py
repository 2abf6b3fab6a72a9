"""Memory-ordered accesses: `pk.load_acquire`, `pk.load_relaxed`, `pk.store_release`,
`pk.store_relaxed`, `pk.fence(scope, order)` and the `order=` / `scope=` keywords of the
atomics (intrinsics/core.py). They are what blocks that wait on each other's counters need
(a persistent kernel's dependency protocol): a release store publishes every write before it
to the thread whose acquire load reads the stored value.

Input: call nodes; output: Values. The target's form: targets/nvptx_memorder.py (PTX
`ld.acquire.gpu`, `st.release.gpu`, `atom.acq_rel.gpu`, `fence.acq_rel.gpu`, sm_70+) and
targets/cpu_memorder.py (LLVM atomic loads, stores, read-modify-writes and fences with the same
orderings: real semantics, since the CPU target runs blocks on several host threads)."""
from __future__ import annotations

from ..lower.memory import element_pointer
from ..lower.values import ConstValue, Value, describe
from ..types import f32, f64, i32, i64, u32, u64
from .base import intrinsic

SCOPES = ("cta", "cluster", "gpu", "sys")
ORDERED_TYPES = (i32, u32, f32, i64, u64, f64)     # the .b32 / .b64 accesses
ATOMIC_ORDERS = ("relaxed", "acquire", "release", "acq_rel")
FENCE_ORDERS = ("acq_rel", "sc")
MEMORDER_ARCH = 70                                 # .relaxed/.acquire/.release: PTX 6.0, sm_70


def _string_keyword(fl, node, name, allowed, default):
    """A compile-time string keyword (`scope="gpu"`) checked against `allowed`."""
    for kw in node.keywords:
        if kw.arg == name:
            value = fl.expr(kw.value)
            if not isinstance(value, ConstValue) or value.value not in allowed:
                raise fl.error(kw.value, f"{name} must be a constant string, one of "
                               f"{', '.join(repr(a) for a in allowed)}; got {describe(value)}")
            return value.value
    return default


def _check_keywords(fl, node, what, allowed):
    for kw in node.keywords:
        if kw.arg not in allowed:
            raise fl.error(kw, f"pk.{what}() has no keyword {kw.arg!r}",
                           hint=f"its keywords: {', '.join(allowed)}")


def memory_scope(fl, node, what):
    """The `scope=` keyword (default "gpu"), with the arch it needs checked."""
    scope = _string_keyword(fl, node, "scope", SCOPES, "gpu")
    fl.ctx.require_arch(90 if scope == "cluster" else MEMORDER_ARCH,
                        f"{what} (scope {scope!r})", fl, node)
    return scope


def _ordered_address(fl, node, what, nargs, store):
    _check_keywords(fl, node, what, ("scope",))
    if len(node.args) != nargs:
        form = "ptr, index, value" if store else "ptr, index"
        raise fl.error(node, f"pk.{what}({form}) takes {nargs} arguments")
    scope = memory_scope(fl, node, f"pk.{what}")
    addr = element_pointer(fl, node, node.args[0], node.args[1])
    if addr.elem not in ORDERED_TYPES:
        raise fl.error(node, f"pk.{what} accesses 32- or 64-bit scalars (i32, u32, f32, i64, "
                       f"u64, f64), not {addr.elem}")
    if store and addr.readonly:
        raise fl.error(node, f"pk.{what} cannot store through a read-only pointer")
    site = fl.ctx.site(fl, node, f"out-of-bounds {what}")
    ptr = fl.ctx.target.check_address(fl.ctx, addr.ptr, addr.elem, addr.origin, site)
    return addr.elem, ptr, scope


def _ordered_load(order):
    name = f"load_{order}"

    def lower(fl, node):
        elem, ptr, scope = _ordered_address(fl, node, name, 2, False)
        return Value(elem, fl.ctx.target.lower_intrinsic("ordered_load", fl, ptr, elem, order,
                                                         scope))
    lower.__doc__ = (f"`pk.{name}(p, i, scope=\"gpu\")`: p[i] read with {order} semantics "
                     f"(`ld.{order}.<scope>.b32/.b64`, sm_70+).")
    return intrinsic(name)(lower)


def _ordered_store(order):
    name = f"store_{order}"

    def lower(fl, node):
        elem, ptr, scope = _ordered_address(fl, node, name, 3, True)
        value = fl.coerce(fl.expr(node.args[2]), elem, node)
        fl.ctx.target.lower_intrinsic("ordered_store", fl, ptr, elem, value.ir, order, scope)
        return ConstValue(None)
    lower.__doc__ = (f"`pk.{name}(p, i, v, scope=\"gpu\")`: p[i] = v with {order} semantics "
                     f"(`st.{order}.<scope>.b32/.b64`, sm_70+).")
    return intrinsic(name)(lower)


load_acquire = _ordered_load("acquire")
load_relaxed = _ordered_load("relaxed")
store_release = _ordered_store("release")
store_relaxed = _ordered_store("relaxed")


def atomic_ordering(fl, node, op):
    """The atomics' `order=` and `scope=` keywords: None for a plain atomic (relaxed at gpu
    scope, what PTX's `atom` without qualifiers is), else (order, scope)."""
    given = {kw.arg for kw in node.keywords}
    if not given:
        return None
    _check_keywords(fl, node, f"atomic_{op}", ("order", "scope"))
    order = _string_keyword(fl, node, "order", ATOMIC_ORDERS, "relaxed")
    scope = memory_scope(fl, node, f"pk.atomic_{op} with order/scope")
    return order, scope


@intrinsic("fence")
def fence(fl, node):
    """`pk.fence(scope="gpu", order="acq_rel")`: orders this thread's memory accesses before
    it against those after it, as seen by threads of `scope` (`fence.acq_rel.gpu` /
    `fence.sc.gpu`, sm_70+)."""
    if node.args:
        raise fl.error(node, "pk.fence takes keywords only: pk.fence(scope=\"gpu\", "
                       "order=\"acq_rel\")")
    _check_keywords(fl, node, "fence", ("scope", "order"))
    order = _string_keyword(fl, node, "order", FENCE_ORDERS, "acq_rel")
    scope = memory_scope(fl, node, "pk.fence")
    fl.ctx.target.lower_intrinsic("ordered_fence", fl, order, scope)
    return ConstValue(None)
