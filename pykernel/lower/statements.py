"""Statement lowering: assignment, control flow (if/for/while/break/continue/return), assert."""
from __future__ import annotations

import ast

from llvmlite import ir

from ..errors import KernelSourceError
from .ops import TypeMismatch
from ..types import SCALARS, ScalarType
from .codegen import LoopTarget
from .values import ConstValue, GlobalRef, TupleValue, Value, describe


def lower_assign(fl, node: ast.Assign):
    val = fl.expr(node.value)
    for target in node.targets:
        assign_target(fl, target, val, node)


def assign_target(fl, target, val, node):
    if isinstance(target, ast.Name):
        fl.assign_name(target.id, val, target)
    elif isinstance(target, ast.Tuple):
        if not isinstance(val, TupleValue) or len(val.items) != len(target.elts):
            raise fl.error(node, f"cannot unpack {describe(val)} into {len(target.elts)} names")
        for t, v in zip(target.elts, val.items):
            assign_target(fl, t, v, node)
    elif isinstance(target, ast.Subscript):
        from .memory import store_subscript
        store_subscript(fl, target, val)
    elif isinstance(target, ast.Attribute):
        raise fl.error(target, "assigning to attributes is not supported in kernels")
    else:
        raise fl.error(target, f"cannot assign to {type(target).__name__}")


def lower_annassign(fl, node: ast.AnnAssign):
    ann = resolve_annotation(fl, node.annotation)
    if node.value is None:
        raise fl.error(node, "a declaration needs a value, e.g. `x: f32 = 0.0`")
    val = fl.coerce(fl.expr(node.value), ann, node.value)
    if not isinstance(node.target, ast.Name):
        raise fl.error(node.target, "annotated assignment needs a plain name")
    fl.assign_name(node.target.id, val, node.target)


def resolve_annotation(fl, node):
    val = fl.expr(node)
    from .values import TypeValue
    if isinstance(val, TypeValue):
        return val.ty
    if isinstance(val, GlobalRef) and isinstance(val.obj, ScalarType):
        return val.obj
    raise fl.error(node, "expected a scalar type annotation such as f32 or i32",
                   hint="types: " + " ".join(SCALARS))


def lower_augassign(fl, node: ast.AugAssign):
    from .expressions import binop_values
    if isinstance(node.target, ast.Name):
        name = node.target.id
        current, operand = fl.lookup(name, node.target), fl.expr(node.value)
        try:
            result = binop_values(fl, node.op, current, operand, node)
        except (KernelSourceError, TypeMismatch):
            located = _literal_type_error(fl, name, current, operand, node)
            if located is None:
                raise
            raise located from None
        fl.assign_name(name, result, node.target)
    elif isinstance(node.target, ast.Subscript):
        from .memory import load_subscript, store_subscript, subscript_address
        addr = subscript_address(fl, node.target)     # evaluate the index once
        current = load_subscript(fl, node.target, addr)
        result = binop_values(fl, node.op, current, fl.expr(node.value), node)
        store_subscript(fl, node.target, result, addr)
    else:
        raise fl.error(node.target, "augmented assignment needs a name or an element")


def _literal_type_error(fl, name, current, operand, node):
    """`acc = 0` then `acc += x[i]` (f32): the mistake is where acc became an integer, so the
    error points there; None when the variable's type did not come from a literal."""
    origin = fl.literal_typed.get(name)
    want = getattr(operand, "ty", None)
    if origin is None or want is None or want == current.ty:
        return None
    start = "0.0" if want.name == "f32" else f"{want}(0)"
    return fl.error(origin, f"'{name}' became {current.ty} here (from a literal), but line "
                    f"{fl.fast.first_line + node.lineno - 1} combines it with {want} values",
                    hint=f"start it as {want}: {name} = {start}")


def lower_if(fl, node: ast.If):
    cond = fl.expr(node.test)
    if isinstance(cond, ConstValue):          # compile-time if: dead branch is not lowered
        fl.body(node.body if cond.value else node.orelse)
        return
    pred = fl.truth(cond, node.test)
    then_bb, end_bb = fl.ctx.append_block("if.then"), fl.ctx.append_block("if.end")
    else_bb = fl.ctx.append_block("if.else") if node.orelse else end_bb
    fl.b.cbranch(pred, then_bb, else_bb)
    fl.b.position_at_end(then_bb)
    fl.body(node.body)
    if not fl.b.block.is_terminated:
        fl.b.branch(end_bb)
    if node.orelse:
        fl.b.position_at_end(else_bb)
        fl.body(node.orelse)
        if not fl.b.block.is_terminated:
            fl.b.branch(end_bb)
    fl.b.position_at_end(end_bb)


def lower_while(fl, node: ast.While):
    if node.orelse:
        raise fl.error(node, "while/else is not supported in kernels")
    cond_bb, body_bb = fl.ctx.append_block("while.cond"), fl.ctx.append_block("while.body")
    end_bb = fl.ctx.append_block("while.end")
    fl.b.branch(cond_bb)
    fl.b.position_at_end(cond_bb)
    cond = fl.expr(node.test)
    if isinstance(cond, ConstValue):
        fl.b.branch(body_bb if cond.value else end_bb)
    else:
        fl.b.cbranch(fl.truth(cond, node.test), body_bb, end_bb)
    fl.b.position_at_end(body_bb)
    fl.loops.append(LoopTarget(cond_bb, end_bb))
    fl.body(node.body)
    fl.loops.pop()
    if not fl.b.block.is_terminated:
        fl.b.branch(cond_bb)
    fl.b.position_at_end(end_bb)


def lower_for(fl, node: ast.For):
    if node.orelse:
        raise fl.error(node, "for/else is not supported in kernels")
    call = node.iter
    if not (isinstance(call, ast.Call) and not call.keywords and 1 <= len(call.args) <= 3):
        raise fl.error(node.iter, "for loops iterate over range(...) or pk.static_range(...)")
    fn = fl.expr(call.func)
    from ..intrinsics.core import static_range
    if isinstance(fn, GlobalRef) and fn.obj is static_range:
        return lower_static_for(fl, node, call)
    if not (isinstance(fn, GlobalRef) and fn.obj is range):
        raise fl.error(node.iter, "for loops iterate over range(...) or pk.static_range(...)")
    if not isinstance(node.target, ast.Name):
        raise fl.error(node.target, "the loop variable must be a plain name")
    start, stop, step = range_args(fl, call)
    ty = loop_type(fl, (start, stop, step), call)
    start, stop, step = (fl.coerce(v, ty, call) for v in (start, stop, step))
    fl.assign_name(node.target.id, start, node.target)
    _, slot, _ = fl.vars[node.target.id]
    # Hidden counter: the user may assign to the loop variable inside the body (Python
    # semantics: the next iteration still takes the next range value).
    counter = fl.ctx.alloca(ty.llvm, "range.i")
    fl.b.store(start.ir, counter)
    cond_bb, body_bb = fl.ctx.append_block("for.cond"), fl.ctx.append_block("for.body")
    inc_bb, end_bb = fl.ctx.append_block("for.inc"), fl.ctx.append_block("for.end")
    fl.b.branch(cond_bb)
    fl.b.position_at_end(cond_bb)
    i = fl.b.load(counter)
    fl.b.cbranch(range_condition(fl, ty, i, stop, step), body_bb, end_bb)
    fl.b.position_at_end(body_bb)
    fl.b.store(i, slot)
    fl.loops.append(LoopTarget(inc_bb, end_bb))
    fl.body(node.body)
    fl.loops.pop()
    if not fl.b.block.is_terminated:
        fl.b.branch(inc_bb)
    fl.b.position_at_end(inc_bb)
    fl.b.store(fl.b.add(fl.b.load(counter), step.ir), counter)
    fl.b.branch(cond_bb)
    fl.b.position_at_end(end_bb)


def range_args(fl, call):
    args = [fl.expr(a) for a in call.args]
    if len(args) == 1:
        args = [ConstValue(0), args[0], ConstValue(1)]
    elif len(args) == 2:
        args.append(ConstValue(1))
    if isinstance(args[2], ConstValue) and args[2].value == 0:
        raise fl.error(call.args[2], "range() step must not be zero")
    return args


def loop_type(fl, vals, node):
    types = {v.ty for v in vals if isinstance(v, Value)}
    for v in vals:
        if not isinstance(v, (Value, ConstValue)) or \
                (isinstance(v, ConstValue) and not isinstance(v.value, int)):
            raise fl.error(node, f"range() arguments must be integers, got {describe(v)}")
    if len(types) > 1:
        raise fl.error(node, "range() arguments have different types: "
                       + ", ".join(sorted(map(str, types))),
                       hint="convert them to one integer type")
    ty = types.pop() if types else fl.materialize(max(vals, key=lambda v: abs(v.value)),
                                                  node).ty
    if not ty.is_int:
        raise fl.error(node, f"range() arguments must be integers, got {ty}")
    return ty


def range_condition(fl, ty, i, stop, step):
    b = fl.b
    if isinstance(step.ir, ir.Constant):
        negative = ty.is_signed and step.ir.constant >= (1 << (ty.bits - 1))
        up = b.icmp_signed("<", i, stop.ir) if ty.is_signed else b.icmp_unsigned("<", i, stop.ir)
        if not negative:
            return up
        return b.icmp_signed(">", i, stop.ir)
    zero = ir.Constant(ty.llvm, 0)
    if not ty.is_signed:
        return b.icmp_unsigned("<", i, stop.ir)
    up = b.and_(b.icmp_signed(">", step.ir, zero), b.icmp_signed("<", i, stop.ir))
    down = b.and_(b.icmp_signed("<", step.ir, zero), b.icmp_signed(">", i, stop.ir))
    return b.or_(up, down)


def lower_static_for(fl, node, call):
    vals = [fl.expr(a) for a in call.args]
    if not all(isinstance(v, ConstValue) and isinstance(v.value, int) for v in vals):
        raise fl.error(call, "pk.static_range(...) needs compile-time integer arguments",
                       hint="use Const[int] parameters or literals; range() for runtime bounds")
    if not isinstance(node.target, ast.Name):
        raise fl.error(node.target, "the loop variable must be a plain name")
    if len(vals) == 3 and vals[2].value == 0:
        raise fl.error(call, "pk.static_range step must not be zero")
    values = range(*[v.value for v in vals])     # a range: 10**12 iterations cost nothing
    count = values.__len__() if abs(values.stop - values.start) < 2**62 else 2**62
    if count > 4096:
        raise fl.error(call, f"pk.static_range unrolls {count} iterations (limit 4096)")
    end_bb = fl.ctx.append_block("unroll.end")
    name = node.target.id
    saved = fl.vars.get(name)
    for k in values:
        next_bb = fl.ctx.append_block("unroll.next")
        fl.vars[name] = ConstValue(k)
        fl.loops.append(LoopTarget(next_bb, end_bb))
        fl.body(node.body)
        fl.loops.pop()
        if not fl.b.block.is_terminated:
            fl.b.branch(next_bb)
        fl.b.position_at_end(next_bb)
    fl.b.branch(end_bb)
    fl.b.position_at_end(end_bb)
    if saved is not None:
        fl.vars[name] = saved
    else:
        fl.vars.pop(name, None)


def lower_break(fl, node):
    if not fl.loops:
        raise fl.error(node, "'break' outside a loop")
    fl.b.branch(fl.loops[-1].brk)


def lower_continue(fl, node):
    if not fl.loops:
        raise fl.error(node, "'continue' outside a loop")
    fl.b.branch(fl.loops[-1].cont)


def lower_return(fl, node: ast.Return):
    if fl.return_block is None:             # the kernel itself
        if node.value is not None:
            raise fl.error(node, "kernels return nothing; write results through a Ptr")
        fl.b.branch(fl.ctx.exit_block)
        return
    from .functions import store_return
    store_return(fl, node)


def lower_expr_stmt(fl, node: ast.Expr):
    if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
        return  # docstring
    fl.expr(node.value)


def lower_assert(fl, node: ast.Assert):
    if not fl.ctx.options.debug:
        return                            # asserts compile in only in debug mode
    cond = fl.expr(node.test)
    if isinstance(cond, ConstValue):
        if not cond.value:
            raise fl.error(node, "assertion is always false")
        return
    ok_bb, fail_bb = fl.ctx.append_block("assert.ok"), fl.ctx.append_block("assert.fail")
    fl.b.cbranch(fl.truth(cond, node.test), ok_bb, fail_bb)
    fl.b.position_at_end(fail_bb)
    fl.ctx.target.assert_fail(fl.ctx, fl.ctx.site(fl, node, "assertion failed"))
    if not fl.b.block.is_terminated:
        fl.b.branch(ok_bb)
    fl.b.position_at_end(ok_bb)


STATEMENTS = {
    ast.Assign: lower_assign, ast.AnnAssign: lower_annassign, ast.AugAssign: lower_augassign,
    ast.If: lower_if, ast.While: lower_while, ast.For: lower_for, ast.Break: lower_break,
    ast.Continue: lower_continue, ast.Return: lower_return, ast.Pass: lambda fl, n: None,
    ast.Expr: lower_expr_stmt, ast.Assert: lower_assert,
}
