"""Inlining of @pk.func device functions at the call site (so barriers and warp operations
inside them work on every target, including the CPU target's coroutines)."""
from __future__ import annotations

import ast

from ..types import ArrayAnnotation, ConstAnnotation, PtrAnnotation, PtrType, ScalarType, bool_
from .codegen import FunctionLowering
from .ptr_bounds import ReturnBounds
from .values import (ArrayValue, ConstValue, NdArrayValue, PtrValue, TupleValue, TypeValue, Value,
                     describe)


def bind_arguments(fl, dfunc, fast, node):
    args = fast.tree.args
    if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
        raise fast.error(fast.tree, "device functions take plain positional parameters only")
    names = [a.arg for a in args.args]
    values = [fl.expr(a) for a in node.args]
    if len(values) > len(names):
        raise fl.error(node, f"{fast.name}() takes {len(names)} arguments, got {len(values)}")
    given = dict(zip(names, values))
    for kw in node.keywords:
        if kw.arg not in names or kw.arg in given:
            raise fl.error(node, f"{fast.name}() got an unexpected or repeated argument "
                           f"'{kw.arg}'")
        given[kw.arg] = fl.expr(kw.value)
    defaults = dict(zip(names[len(names) - len(args.defaults):], args.defaults))
    for name in names:
        if name not in given:
            if name not in defaults:
                raise fl.error(node, f"{fast.name}() is missing argument '{name}'")
            given[name] = ConstValue(ast.literal_eval(defaults[name]))
    annotations = dfunc.annotations()
    return [(a, given[a.arg], annotations.get(a.arg)) for a in args.args]


def inline_call(fl, dfunc, node):
    fast = dfunc.parsed()
    stack = fl.ctx.call_stack
    if dfunc in stack:
        raise fl.error(node, f"recursive call of '{fast.name}' (recursion is not supported "
                       "in kernels)")
    child = FunctionLowering(fast, fl.ctx, {}, parent=fl)
    for arg_node, val, ann in bind_arguments(fl, dfunc, fast, node):
        bind_param(fl, child, arg_node, val, ann, node)
    child.return_block = fl.ctx.append_block(f"{fast.name}.ret")
    child.return_annotation = dfunc.annotations().get("return")
    stack.append(dfunc)
    try:
        child.body(fast.tree.body)
    finally:
        stack.pop()
    if not fl.b.block.is_terminated:
        fl.b.branch(child.return_block)
    fl.b.position_at_end(child.return_block)
    if child.return_slots is None:
        return ConstValue(None)
    vals = [Value(ty, fl.b.load(slot)) if isinstance(ty, ScalarType)
            else PtrValue(ty, fl.b.load(slot), bounds.origin(fl))
            for (slot, ty), bounds in zip(child.return_slots, child.return_bounds)]
    return vals[0] if not child.return_tuple else TupleValue(tuple(vals))


def bind_param(fl, child, arg_node, val, ann, node):
    name = arg_node.arg
    if ann is bool:                       # Python's bool reads as the DSL's bool_
        ann = bool_
    if isinstance(ann, ConstAnnotation):
        if not isinstance(val, (ConstValue, TypeValue)):
            raise fl.error(node, f"argument '{name}' must be a compile-time constant")
        child.vars[name] = val
        return
    if isinstance(ann, ScalarType):
        val = fl.coerce(val, ann, node)
    elif isinstance(ann, PtrAnnotation):
        if isinstance(val, ArrayValue):      # shared/local arrays pass as pointers
            val = PtrValue(PtrType(val.ty.elem, False, val.ty.space), val.ir, val.origin)
        if not isinstance(val, PtrValue):
            raise fl.error(node, f"argument '{name}' expects a pointer, got {describe(val)}")
    elif isinstance(ann, ArrayAnnotation):
        if not isinstance(val, NdArrayValue) or val.ty.rank != ann.rank:
            raise fl.error(node, f"argument '{name}' expects a {ann.rank}-d array parameter, "
                           f"got {describe(val)}")
    elif ann is not None and not isinstance(ann, str):
        raise child.error(arg_node, f"unsupported annotation for parameter '{name}'")
    if isinstance(val, (Value, PtrValue, ConstValue)) and not (
            isinstance(val, ConstValue) and not isinstance(val.value, (bool, int, float))):
        child.assign_name(name, val, arg_node) if not isinstance(val, ConstValue) else \
            child.vars.__setitem__(name, val)
    else:
        child.vars[name] = val


def store_return(fl, node: ast.Return):
    if node.value is None:
        fl.b.branch(fl.return_block)
        return
    val = fl.expr(node.value)
    items = val.items if isinstance(val, TupleValue) else (val,)
    ann = getattr(fl, "return_annotation", None)
    if isinstance(ann, ScalarType) and not isinstance(val, TupleValue):
        items = (fl.coerce(val, ann, node.value),)
    items = tuple(fl.materialize(v, node.value) for v in items)
    for v in items:
        if not isinstance(v, (Value, PtrValue)):
            raise fl.error(node.value, f"cannot return {describe(v)} from a device function")
    if fl.return_slots is None:
        fl.return_tuple = isinstance(val, TupleValue)
        fl.return_slots = [(fl.ctx.alloca(v.ir.type, "ret"), v.ty) for v in items]
        fl.return_bounds = [ReturnBounds(fl) if isinstance(v, PtrValue) else None
                            for v in items]
    elif len(items) != len(fl.return_slots) or any(
            v.ty != ty for v, (_, ty) in zip(items, fl.return_slots)):
        raise fl.error(node, "all returns of a device function must return the same types")
    for v, (slot, _), bounds in zip(items, fl.return_slots, fl.return_bounds):
        fl.b.store(v.ir, slot)
        if bounds is not None:          # which memory the result points into, per return
            bounds.store(fl, v.origin)
    fl.b.branch(fl.return_block)
