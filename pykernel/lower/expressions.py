"""Expression lowering: literals, names, arithmetic, comparisons (chained), short-circuit
and/or/not, conditional expressions, attribute access, subscripts, tuples and calls."""
from __future__ import annotations

import ast
import operator

from llvmlite import ir

from ..types import bool_
from . import ndarray, ops
from .ptr_bounds import branch_bounds, phi_origin
from .values import (ConstValue, GlobalRef, NdArrayValue, PtrValue, TupleValue, TypeValue, Value,
                     describe)

PY_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
             ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
             ast.Pow: operator.pow, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
             ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor}
PY_CMPS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.Eq: operator.eq, ast.NotEq: operator.ne}


def lower_constant(fl, node: ast.Constant):
    if isinstance(node.value, (bool, int, float)):
        return ConstValue(node.value)
    if isinstance(node.value, str):
        return ConstValue(node.value)       # only meaningful as an intrinsic argument
    raise fl.error(node, f"{type(node.value).__name__} constants are not supported in kernels")


def lower_name(fl, node: ast.Name):
    return fl.lookup(node.id, node)


def unify(fl, a, b, node):
    """Bring two operands to one runtime type; literals adapt, mixed runtime types are errors."""
    if isinstance(a, ConstValue) and isinstance(b, Value):
        return fl.coerce(a, b.ty, node), b, b.ty
    if isinstance(b, ConstValue) and isinstance(a, Value):
        return a, fl.coerce(b, a.ty, node), a.ty
    a, b = fl.materialize(a, node), fl.materialize(b, node)
    if not isinstance(a, Value) or not isinstance(b, Value):
        raise fl.error(node, f"cannot combine {describe(a)} and {describe(b)}")
    if a.ty != b.ty:
        raise ops.TypeMismatch(f"operands have different types: {a.ty} and {b.ty}",
                               hint=f"convert explicitly, e.g. {a.ty}(...) or {b.ty}(...)")
    return a, b, a.ty


# Folded integers beyond this many bits fit no kernel type: refuse before Python computes a
# huge number (`10 ** 10**9`, `1 << 10**9` would take minutes and gigabytes)
MAX_FOLD_BITS = 4096


def fold_binop(fl, op, x, y, node):
    """A binary operation on two compile-time values, as Python computes it."""
    grows = isinstance(x, int) and isinstance(y, int) and (
        (op is ast.LShift and x != 0 and y > MAX_FOLD_BITS) or
        (op is ast.Pow and abs(x) > 1 and y * abs(x).bit_length() > MAX_FOLD_BITS))
    if op is ast.Mult and isinstance(x, (str, int)) and isinstance(y, (str, int)) and \
            isinstance(x, str) != isinstance(y, str):    # "ab" * 10**9: a string of 2 GB
        text, times = (x, y) if isinstance(x, str) else (y, x)
        grows = len(text) * times > MAX_FOLD_BITS
    if grows:
        raise fl.error(node, f"constant expression too large to fold (more than "
                       f"{MAX_FOLD_BITS} bits); no kernel type holds it")
    try:
        return ConstValue(PY_BINOPS[op](x, y))
    except (ArithmeticError, TypeError, ValueError, KeyError) as exc:
        raise fl.error(node, f"cannot fold constant expression: {exc}") from None


def binop_values(fl, op, a, b, node):
    op = type(op)
    if isinstance(a, ConstValue) and isinstance(b, ConstValue):
        return fold_binop(fl, op, a.value, b.value, node)
    if isinstance(a, PtrValue) and op in (ast.Add, ast.Sub):
        return ptr_offset(fl, a, b, op, node)
    if op is ast.Pow:
        return power(fl, a, b, node)
    x, y, ty = unify(fl, a, b, node)
    if ops.is_packed(ty):
        native = fl.ctx.target.half_native(ty.elem, HALF_OP_NAMES.get(op, ""))
        return Value(ty, ops.packed_binop(fl.b, op, ty, x.ir, y.ir, fl.ctx.options.fp_contract,
                                          native))
    if ty.is_float:
        native = ops.is_half(ty) and fl.ctx.target.half_native(ty, HALF_OP_NAMES.get(op, ""))
        res = ops.float_binop(fl.b, op, ty, x.ir, y.ir, lambda t, v: floor_value(fl, t, v),
                              fl.ctx.options.fp_contract, native)
    elif ty is bool_ and op in (ast.BitAnd, ast.BitOr, ast.BitXor):
        res = ops.int_binop(fl.b, op, ty, x.ir, y.ir)
    elif ty.is_int:
        res = ops.int_binop(fl.b, op, ty, x.ir, y.ir)
    else:
        raise ops.TypeMismatch(f"cannot {ops.OP_NAMES.get(op, op.__name__)} {ty} values",
                               hint="compute in f32: f32(a) * f32(b), then e4m3(...) to store"
                               if ty.is_fp8 else None)
    return Value(ty, res)


HALF_OP_NAMES = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul"}


def floor_value(fl, ty, v):
    fn = fl.ctx.intrinsic_decl("llvm.floor", ty.llvm)
    return fl.b.call(fn, [v])


def power(fl, a, b, node):
    if not (isinstance(b, ConstValue) and isinstance(b.value, int) and 0 <= b.value <= 16):
        raise fl.error(node, "** needs a small non-negative integer literal exponent",
                       hint="use pk.exp2/pk.log2 for general powers")
    a = fl.materialize(a, node)
    result = None
    for _ in range(b.value):
        result = a if result is None else binop_values(fl, ast.Mult(), result, a, node)
    return result if result is not None else fl.coerce(ConstValue(1), a.ty, node)


def ptr_offset(fl, p: PtrValue, k, op, node):
    k = fl.materialize(k, node)
    if not isinstance(k, Value) or not k.ty.is_int:
        raise fl.error(node, f"pointer offset must be an integer, got {describe(k)}")
    idx = ops.index_to_i64(fl.b, k.ty, k.ir)
    if op is ast.Sub:
        idx = fl.b.neg(idx)
    return PtrValue(p.ty, fl.b.gep(p.ir, [idx]), p.origin)


def lower_binop(fl, node: ast.BinOp):
    return binop_values(fl, node.op, fl.expr(node.left), fl.expr(node.right), node)


def lower_unaryop(fl, node: ast.UnaryOp):
    v = fl.expr(node.operand)
    if isinstance(v, ConstValue):
        fold = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_,
                ast.Invert: operator.invert}[type(node.op)]
        return ConstValue(fold(v.value))
    if isinstance(node.op, ast.Not):
        return Value(bool_, fl.b.not_(fl.truth(v, node.operand)))
    v = fl.materialize(v, node)
    if not isinstance(v, Value):
        raise fl.error(node, f"unary operator on {describe(v)}")
    if isinstance(node.op, ast.UAdd):
        return v
    if isinstance(node.op, ast.USub):
        return Value(v.ty, ops.negate(fl.b, v.ty, v.ir))
    if not v.ty.is_int and v.ty is not bool_:
        raise fl.error(node, f"~ needs an integer, got {v.ty}")
    return Value(v.ty, fl.b.not_(v.ir))


def lower_boolop(fl, node: ast.BoolOp):
    """Short-circuit `and`/`or`: later operands run only when needed."""
    is_and = isinstance(node.op, ast.And)
    first = fl.expr(node.values[0])
    if isinstance(first, ConstValue):
        if bool(first.value) != is_and:   # `False and ...`, `True or ...`
            return ConstValue(bool(first.value))
        rest = node.values[1:]
        if len(rest) == 1:
            v = fl.expr(rest[0])
            return ConstValue(bool(v.value)) if isinstance(v, ConstValue) else \
                Value(bool_, fl.truth(v, rest[0]))
        return lower_boolop(fl, ast.BoolOp(op=node.op, values=rest))
    end_bb = fl.ctx.append_block("bool.end")
    incoming = []
    pred = fl.truth(first, node.values[0])
    for value_node in node.values[1:]:
        next_bb = fl.ctx.append_block("bool.next")
        incoming.append((pred, fl.b.block))
        if is_and:
            fl.b.cbranch(pred, next_bb, end_bb)
        else:
            fl.b.cbranch(pred, end_bb, next_bb)
        fl.b.position_at_end(next_bb)
        pred = fl.truth(fl.expr(value_node), value_node)
    incoming.append((pred, fl.b.block))
    fl.b.branch(end_bb)
    fl.b.position_at_end(end_bb)
    phi = fl.b.phi(ir.IntType(1))
    for val, bb in incoming:
        phi.add_incoming(val, bb)
    return Value(bool_, phi)


def compare_values(fl, op, a, b, node):
    if isinstance(a, ConstValue) and isinstance(b, ConstValue):
        return ConstValue(PY_CMPS[type(op)](a.value, b.value))
    if isinstance(a, TypeValue) or isinstance(b, TypeValue):   # `if T == f16:` in generics
        if not (isinstance(a, TypeValue) and isinstance(b, TypeValue)
                and type(op) in (ast.Eq, ast.NotEq)):
            raise fl.error(node, f"types compare only with == or != against another type, "
                                 f"not {describe(a)} and {describe(b)}")
        return ConstValue(PY_CMPS[type(op)](a.ty, b.ty))
    x, y, ty = unify(fl, a, b, node)
    native = ops.is_half(ty) and fl.ctx.target.half_native(ty, "cmp")
    return Value(bool_, ops.compare(fl.b, type(op), ty, x.ir, y.ir, native))


def lower_compare(fl, node: ast.Compare):
    """`a < b < c` is `a < b and b < c` with b evaluated once (short-circuit)."""
    left = fl.expr(node.left)
    result = None
    for op, right_node in zip(node.ops, node.comparators):
        if type(op) not in PY_CMPS:
            raise fl.error(node, f"comparison '{type(op).__name__}' is not supported in kernels")
        right = fl.expr(right_node)
        cur = compare_values(fl, op, left, right, node)
        result = cur if result is None else and_values(fl, result, cur, node)
        left = right
    return result


def and_values(fl, a, b, node):
    if isinstance(a, ConstValue) and isinstance(b, ConstValue):
        return ConstValue(a.value and b.value)
    return Value(bool_, fl.b.and_(fl.truth(a, node), fl.truth(b, node)))


def lower_ifexp(fl, node: ast.IfExp):
    cond = fl.expr(node.test)
    if isinstance(cond, ConstValue):
        return fl.expr(node.body if cond.value else node.orelse)
    pred = fl.truth(cond, node.test)
    then_bb, else_bb = fl.ctx.append_block("sel.then"), fl.ctx.append_block("sel.else")
    end_bb = fl.ctx.append_block("sel.end")
    fl.b.cbranch(pred, then_bb, else_bb)
    fl.b.position_at_end(then_bb)
    a = fl.expr(node.body)
    then_end = fl.b.block
    fl.b.position_at_end(else_bb)
    c = fl.expr(node.orelse)
    else_end = fl.b.block
    # Types: literals adapt to the other branch.
    if isinstance(a, ConstValue) and not isinstance(c, ConstValue):
        fl.b.position_at_end(then_end)
        a = fl.coerce(a, c.ty, node.body)
    elif isinstance(c, ConstValue) and not isinstance(a, ConstValue):
        fl.b.position_at_end(else_end)
        c = fl.coerce(c, a.ty, node.orelse)
    else:
        fl.b.position_at_end(then_end)
        a = fl.materialize(a, node.body)
        fl.b.position_at_end(else_end)
        c = fl.materialize(c, node.orelse)
    if type(a) is not type(c) or a.ty != c.ty:
        raise fl.error(node, f"branches of the conditional expression differ: {describe(a)} "
                       f"and {describe(c)}")
    pointers = isinstance(a, PtrValue)
    fl.b.position_at_end(then_end)
    then_bounds = branch_bounds(fl, a, c) if pointers else None
    fl.b.branch(end_bb)
    fl.b.position_at_end(else_end)
    else_bounds = branch_bounds(fl, c, a) if pointers else None
    fl.b.branch(end_bb)
    fl.b.position_at_end(end_bb)
    phi = fl.b.phi(a.ir.type)
    phi.add_incoming(a.ir, then_end)
    phi.add_incoming(c.ir, else_end)
    if not pointers:
        return type(a)(a.ty, phi)
    origin = (a.origin if then_bounds is None else
              phi_origin(fl, then_bounds, then_end, else_bounds, else_end))
    return PtrValue(a.ty, phi, origin)


def lower_attribute(fl, node: ast.Attribute):
    base = fl.expr(node.value)
    if isinstance(base, GlobalRef):
        obj = base.obj
        lower_attr = getattr(obj, "lower_attr", None)
        if lower_attr is not None:
            return lower_attr(fl, node.attr, node)
        if not hasattr(obj, node.attr):
            raise fl.error(node, f"{getattr(obj, '__name__', obj)!s} has no attribute "
                           f"'{node.attr}'")
        return fl.wrap_global(getattr(obj, node.attr), node)
    if isinstance(base, NdArrayValue):
        return ndarray.attribute(fl, node, base)
    if isinstance(base, TypeValue) and node.attr in ("bits", "nbytes"):
        return ConstValue(getattr(base.ty, node.attr))
    if isinstance(base, Value) and ops.is_packed(base.ty) and node.attr in ("x", "y"):
        return packed_lane(fl, base, "xy".index(node.attr))
    raise fl.error(node, f"{describe(base)} has no attribute '{node.attr}'")


def lower_tuple(fl, node: ast.Tuple):
    return TupleValue(tuple(fl.expr(e) for e in node.elts))


def lower_subscript(fl, node: ast.Subscript):
    base = fl.expr(node.value)
    if isinstance(base, TupleValue):
        idx = fl.expr(node.slice)
        if not isinstance(idx, ConstValue) or not isinstance(idx.value, int):
            raise fl.error(node.slice, "tuples are indexed with compile-time integers")
        try:
            return base.items[idx.value]
        except IndexError:
            raise fl.error(node.slice, f"tuple index {idx.value} out of range "
                           f"(size {len(base.items)})") from None
    if isinstance(base, Value) and ops.is_packed(base.ty):
        idx = fl.expr(node.slice)
        if not (isinstance(idx, ConstValue) and idx.value in (0, 1)
                and not isinstance(idx.value, bool)):
            raise fl.error(node.slice, f"a {base.ty} lane is [0] or [1] (a constant), or .x / .y")
        return packed_lane(fl, base, idx.value)
    from .memory import load_subscript
    return load_subscript(fl, node, None, base)


def packed_lane(fl, pair: Value, k: int) -> Value:
    return Value(pair.ty.elem, fl.b.extract_element(pair.ir, ir.Constant(ir.IntType(32), k)))


def construct_packed(fl, ty, node):
    """`f16x2(a, b)`: a pair from two values of the element type (literals adapt); a in
    lane x (the low 16 bits in memory)."""
    if node.keywords or len(node.args) != ty.lanes:
        raise fl.error(node, f"{ty}() takes {ty.lanes} values (the lanes x, y)")
    lanes = []
    for arg in node.args:
        v = fl.expr(arg)
        if isinstance(v, Value) and v.ty != ty.elem:
            raise fl.error(arg, f"{ty} lanes are {ty.elem}, got {describe(v)}",
                           hint=f"convert explicitly, e.g. {ty.elem}(x)")
        lanes.append(fl.coerce(v, ty.elem, arg).ir)
    return Value(ty, ops.pack_lanes(fl.b, ty, lanes))


def lower_call(fl, node: ast.Call):
    from .calls import lower_call_node
    return lower_call_node(fl, node)


EXPRESSIONS = {
    ast.Constant: lower_constant, ast.Name: lower_name, ast.BinOp: lower_binop,
    ast.UnaryOp: lower_unaryop, ast.BoolOp: lower_boolop, ast.Compare: lower_compare,
    ast.IfExp: lower_ifexp, ast.Attribute: lower_attribute, ast.Tuple: lower_tuple,
    ast.Subscript: lower_subscript, ast.Call: lower_call,
}
