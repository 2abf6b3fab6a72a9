"""Compile-time helpers and memory intrinsics: static_range, shared/local/dynamic arrays,
16-byte vector loads and stores, atomics, bitcast and f16x2 packing."""
from __future__ import annotations

from llvmlite import ir

from ..types import ArrayType, PtrType, ScalarType, f16, f32, f64, i32, u32, u64
from ..lower import ops
from ..lower.memory import element_pointer
from ..lower.resources import check_shared_array, reserve_local
from ..lower.values import (ArrayValue, ConstValue, PtrValue, TupleValue, TypeValue, Value,
                            describe)
from .base import args_of, intrinsic
from .memorder import atomic_ordering


class StaticRange:
    """`for i in pk.static_range(N)`: the loop is unrolled; `i` is a compile-time int."""

    def __call__(self, *args):
        return range(*args)

    def __repr__(self):
        return "pk.static_range"


static_range = StaticRange()


def _type_and_shape(fl, node, name, keywords=()):
    (ty, shape), kwargs = args_of(fl, node, 2, name, keywords)
    if not isinstance(ty, TypeValue):
        raise fl.error(node.args[0], f"pk.{name} needs an element type such as f32, got "
                       f"{describe(ty)}")
    dims = shape.items if isinstance(shape, TupleValue) else (shape,)
    if not all(isinstance(d, ConstValue) and isinstance(d.value, int) and d.value > 0
               for d in dims):
        raise fl.error(node.args[1], f"pk.{name} needs a compile-time positive size",
                       hint="use a literal or a Const[int] parameter")
    if keywords:
        return ty.ty, tuple(d.value for d in dims), kwargs
    return ty.ty, tuple(d.value for d in dims)


SHARED_ALIGNS = (16, 32, 64, 128, 256, 512, 1024)


@intrinsic("shared_array")
def shared_array(fl, node):
    """Static shared memory `pk.shared_array(T, N)` or `(T, (rows, cols))`: `.shared` array,
    16-byte aligned, or `align=` 32..1024 bytes (TMA tiles: 128; tiles a 128-byte-swizzle
    wgmma descriptor reads: 1024)."""
    elem, shape, kwargs = _type_and_shape(fl, node, "shared_array", keywords=("align",))
    align = kwargs.get("align", ConstValue(16))
    if not isinstance(align, ConstValue) or align.value not in SHARED_ALIGNS:
        raise fl.error(node, "pk.shared_array: align must be a compile-time power of two "
                       f"in 16..1024 (bytes), got {describe(align)}")
    aty = ArrayType(elem, shape, "shared")
    check_shared_array(fl, node, aty.count * elem.nbytes)
    ptr = fl.ctx.target.shared_array(fl.ctx, aty, align.value)
    return ArrayValue(aty, ptr, ("array", ptr, aty.count * elem.nbytes))


@intrinsic("local_array")
def local_array(fl, node):
    """Per-thread array in registers/local memory: `pk.local_array(T, N)`."""
    elem, shape = _type_and_shape(fl, node, "local_array")
    aty = ArrayType(elem, shape, "local")
    reserve_local(fl, node, aty.count * elem.nbytes)
    slot = fl.ctx.alloca(ir.ArrayType(elem.storage, aty.count), "local")
    zero = ir.Constant(ir.IntType(32), 0)
    ptr = fl.b.gep(slot, [zero, zero])
    return ArrayValue(aty, ptr, ("array", ptr, aty.count * elem.nbytes))


@intrinsic("dynamic_shared")
def dynamic_shared(fl, node):
    """Dynamic shared memory (size given at launch): `extern .shared .align 16 .b8 []`."""
    (ty,), _ = args_of(fl, node, 1, "dynamic_shared")
    if not isinstance(ty, TypeValue):
        raise fl.error(node, "pk.dynamic_shared needs an element type such as f32")
    ptr, nbytes = fl.ctx.target.dynamic_shared(fl.ctx, ty.ty)
    return PtrValue(PtrType(ty.ty, False, "shared"), ptr, ("range", ptr, nbytes))


@intrinsic("bitcast")
def bitcast(fl, node):
    """Reinterpret the bits of a scalar as another type of the same width: `mov.b32`."""
    (val, ty), _ = args_of(fl, node, 2, "bitcast")
    val = fl.materialize(val, node)
    if not isinstance(ty, TypeValue) or not isinstance(val, Value):
        raise fl.error(node, "pk.bitcast(value, type) needs a scalar and a type")
    if val.ty.bits != ty.ty.bits:
        raise fl.error(node, f"pk.bitcast: {val.ty} has {val.ty.bits} bits, {ty.ty} has "
                       f"{ty.ty.bits}")
    return Value(ty.ty, fl.b.bitcast(val.ir, ty.ty.llvm) if val.ir.type != ty.ty.llvm
                 else val.ir)


@intrinsic("pack_f16x2")
def pack_f16x2(fl, node):
    """Two f32 (or f16) values -> one u32 holding two f16 (low = first): one
    `cvt.rn.f16x2.f32` on sm_80+, two `cvt.rn.f16.f32` and a merge before."""
    (a, c), _ = args_of(fl, node, 2, "pack_f16x2")
    vals = [fl.materialize(v, node) for v in (a, c)]
    for v in vals:
        if not isinstance(v, Value) or not v.ty.is_float:
            raise fl.error(node, f"pk.pack_f16x2 packs floats, got {describe(v)}")
    packed = fl.ctx.target.lower_intrinsic("pack_f16x2", fl, vals)
    if packed is not None:
        return Value(u32, packed)
    halves = []
    for v in vals:
        h = ops.cast(fl.b, v.ty, f16, v.ir)
        halves.append(fl.b.zext(fl.b.bitcast(h, ir.IntType(16)), ir.IntType(32)))
    hi = fl.b.shl(halves[1], ir.Constant(ir.IntType(32), 16))
    return Value(u32, fl.b.or_(halves[0], hi))


@intrinsic("unpack_f16x2")
def unpack_f16x2(fl, node):
    """One u32 holding two f16 -> (low, high) as f32."""
    (v,), _ = args_of(fl, node, 1, "unpack_f16x2")
    v = fl.coerce(v, u32, node)
    out = []
    for shift in (0, 16):
        bits = fl.b.trunc(fl.b.lshr(v.ir, ir.Constant(ir.IntType(32), shift)), ir.IntType(16))
        out.append(Value(f32, ops.to_f32(fl.b, f16, fl.b.bitcast(bits, ir.HalfType()))))
    return TupleValue(tuple(out))


def _vec_width(fl, node, width_val, elem: ScalarType):
    if not isinstance(width_val, ConstValue) or width_val.value not in (2, 4, 8, 16):
        raise fl.error(node, "vector width must be a literal 2, 4, 8 or 16")
    n = width_val.value
    if n * elem.nbytes > 16:
        raise fl.error(node, f"vector of {n} x {elem} is {n * elem.nbytes} bytes; the limit "
                       "is 16 bytes")
    return n


@intrinsic("load_vec")
def load_vec(fl, node):
    """`a, b, c, d = pk.load_vec(p, i, 4)`: one 16-byte `ld.global.v4` of p[i..i+3]; i must be
    a multiple of the width (aligned)."""
    if len(node.args) != 3:
        raise fl.error(node, "pk.load_vec(ptr, index, width) takes 3 arguments")
    l2_fetch = _l2_fetch_keyword(fl, node)
    addr = element_pointer(fl, node, node.args[0], node.args[1])
    n = _vec_width(fl, node, fl.expr(node.args[2]), addr.elem)
    if l2_fetch and n * addr.elem.nbytes < 4:
        raise fl.error(node, "l2_fetch needs a vector of at least 4 bytes")
    site = fl.ctx.site(fl, node, "out-of-bounds vector read")
    vec_ty = ir.VectorType(addr.elem.storage, n)
    raw = fl.ctx.target.load_vector(fl.ctx, addr, vec_ty, site, l2_fetch)
    return TupleValue(tuple(Value(addr.elem, fl.b.extract_element(raw, ir.Constant(
        ir.IntType(32), k))) for k in range(n)))


L2_FETCH_SIZES = (0, 64, 128, 256)


def _l2_fetch_keyword(fl, node) -> int:
    """load_vec's `l2_fetch=` (0, 64, 128 or 256): how many bytes around the access L2 fetches
    from memory on a miss (PTX `.L2::256B`), a hint for streams that touch part of a line per
    instruction."""
    size = 0
    for kw in node.keywords:
        if kw.arg != "l2_fetch":
            raise fl.error(kw, f"pk.load_vec has no keyword {kw.arg!r}", hint="l2_fetch=256")
        value = fl.expr(kw.value)
        if not isinstance(value, ConstValue) or value.value not in L2_FETCH_SIZES:
            raise fl.error(kw.value, "l2_fetch must be a constant 0, 64, 128 or 256")
        size = value.value
    return size


@intrinsic("prefetch_l2")
def prefetch_l2(fl, node):
    """`pk.prefetch_l2(p, i)`: bring the 128-byte line holding p[i] into L2
    (`prefetch.global.L2`; nothing on the CPU target). A hint: it returns nothing, never
    faults, and never changes results; with `pk.grid_dependency_wait()` after it, weights
    stream in while the previous kernel finishes."""
    if len(node.args) != 2:
        raise fl.error(node, "pk.prefetch_l2(ptr, index) takes 2 arguments")
    addr = element_pointer(fl, node, node.args[0], node.args[1])
    emit = getattr(fl.ctx.target, "prefetch_l2", None)
    if emit is not None:
        emit(fl.ctx, addr.ptr)
    return ConstValue(None)


@intrinsic("store_vec")
def store_vec(fl, node):
    """`pk.store_vec(p, i, (a, b, c, d))`: one 16-byte `st.global.v4`."""
    if len(node.args) != 3:
        raise fl.error(node, "pk.store_vec(ptr, index, values) takes 3 arguments")
    addr = element_pointer(fl, node, node.args[0], node.args[1])
    if addr.readonly:
        raise fl.error(node, "cannot store through a read-only pointer")
    vals = fl.expr(node.args[2])
    if not isinstance(vals, TupleValue):
        raise fl.error(node.args[2], "pk.store_vec needs a tuple of values")
    n = _vec_width(fl, node, ConstValue(len(vals.items)), addr.elem)
    vec_ty = ir.VectorType(addr.elem.storage, n)
    vec = ir.Constant(vec_ty, ir.Undefined)
    for k, v in enumerate(vals.items):
        vec = fl.b.insert_element(vec, fl.coerce(v, addr.elem, node).ir,
                                  ir.Constant(ir.IntType(32), k))
    site = fl.ctx.site(fl, node, "out-of-bounds vector write")
    fl.ctx.target.store_vector(fl.ctx, addr, vec, site)
    return ConstValue(None)


ATOMIC_TYPES = {"add": (i32, u32, f32, u64, f64), "max": (i32, u32, f32),
                "min": (i32, u32, f32), "exch": (i32, u32, f32), "cas": (i32, u32)}


def _atomic(op):
    def lower(fl, node):
        nargs = 4 if op == "cas" else 3
        if len(node.args) != nargs:
            raise fl.error(node, f"pk.atomic_{op} takes {nargs} arguments (ptr, index, "
                           f"{'compare, value' if op == 'cas' else 'value'})")
        addr = element_pointer(fl, node, node.args[0], node.args[1])
        if addr.elem not in ATOMIC_TYPES[op]:
            raise fl.error(node, f"pk.atomic_{op} supports "
                           f"{', '.join(map(str, ATOMIC_TYPES[op]))}, not {addr.elem}")
        if addr.readonly:
            raise fl.error(node, "atomics cannot target a read-only pointer")
        ordering = atomic_ordering(fl, node, op)
        if ordering is not None and addr.elem.is_float and op != "add":
            raise fl.error(node, f"pk.atomic_{op} with order/scope takes integers, not "
                           f"{addr.elem}")
        vals = [fl.coerce(fl.expr(a), addr.elem, node).ir for a in node.args[2:]]
        site = fl.ctx.site(fl, node, f"out-of-bounds atomic_{op}")
        ptr = fl.ctx.target.check_address(fl.ctx, addr.ptr, addr.elem, addr.origin, site)
        if ordering is not None:     # intrinsics/memorder.py
            return Value(addr.elem, fl.ctx.target.lower_intrinsic(
                "ordered_atomic", fl, op, ptr, vals, addr.elem, *ordering))
        return Value(addr.elem, fl.ctx.target.atomic(fl.ctx, op, ptr, vals, addr.elem))
    lower.__doc__ = (f"Atomic {op} on global or shared memory; returns the old value. "
                     "`order=` relaxed / acquire / release / acq_rel and `scope=` cta / "
                     "cluster / gpu / sys (sm_70+) make it a memory-ordered atomic.")
    return intrinsic(f"atomic_{op}")(lower)


atomic_add = _atomic("add")
atomic_max = _atomic("max")
atomic_min = _atomic("min")
atomic_exch = _atomic("exch")
atomic_cas = _atomic("cas")
