"""The lowering visitor: a FunctionAST + specialization -> LLVM IR in the target's kernel
function. Types are inferred while lowering (each variable keeps its first type); compile-time
values (literals, Const parameters) fold, so a Const `if` lowers only the taken branch."""
from __future__ import annotations

import ast
import builtins

import numpy as np
from llvmlite import ir

from ..errors import KernelSourceError
from ..types import PtrType, ScalarType, bool_
from . import ops
from .ptr_bounds import BoundSlots, slot_origin, tracks
from .values import (ArrayValue, ConstValue, GlobalRef, NdArrayValue, PtrValue, TupleValue,
                     TypeValue, Value, describe)

UNSUPPORTED = {
    ast.List: "lists", ast.ListComp: "list comprehensions", ast.Dict: "dicts",
    ast.DictComp: "dict comprehensions", ast.Set: "sets", ast.SetComp: "set comprehensions",
    ast.GeneratorExp: "generator expressions", ast.Lambda: "lambdas", ast.ClassDef: "classes",
    ast.FunctionDef: "nested functions", ast.Try: "try/except", ast.With: "with statements",
    ast.Yield: "generators (yield)", ast.YieldFrom: "generators (yield from)",
    ast.Await: "await", ast.Global: "global statements", ast.Nonlocal: "nonlocal statements",
    ast.Delete: "del", ast.Import: "imports", ast.ImportFrom: "imports", ast.Raise: "raise",
    ast.JoinedStr: "f-strings", ast.Starred: "starred expressions", ast.NamedExpr: ":=",
    ast.AsyncFunctionDef: "async functions", ast.Match: "match statements",
}
# what wrapped errors call the construct being lowered (others: the AST class's name)
CONSTRUCTS = {
    ast.BinOp: "arithmetic", ast.UnaryOp: "unary operation", ast.BoolOp: "and/or",
    ast.Compare: "comparison", ast.Call: "call", ast.Subscript: "subscript",
    ast.Attribute: "attribute", ast.Assign: "assignment", ast.AugAssign: "assignment",
    ast.AnnAssign: "assignment", ast.For: "for loop", ast.While: "while loop", ast.If: "if",
    ast.IfExp: "conditional expression", ast.Return: "return", ast.Expr: "expression",
    ast.Constant: "constant", ast.Name: "name",
}
if hasattr(ast, "TryStar"):
    UNSUPPORTED[ast.TryStar] = "try/except*"


class LoopTarget:
    def __init__(self, cont: ir.Block, brk: ir.Block):
        self.cont, self.brk = cont, brk


class FunctionLowering:
    """Lowers one function body. Kernels own the LLVM function; @pk.func bodies are inlined
    into their caller by a child FunctionLowering that shares builder, target and function."""

    def __init__(self, fast, ctx, bindings: dict, parent=None):
        from .statements import STATEMENTS
        from .expressions import EXPRESSIONS
        self.fast, self.ctx = fast, ctx               # ctx: KernelContext (target, builder, ...)
        self.vars: dict[str, object] = {}             # name -> ("slot", alloca, type) | value
        self.vars.update(bindings)
        # variables whose type came from a literal (`acc = 0` -> i32): where, for errors
        self.literal_typed: dict[str, ast.AST] = {}
        self.loops: list[LoopTarget] = []
        self.parent = parent
        self.return_block = None                      # inlined funcs: where `return` goes
        self.return_slots = None
        # per function, not per inlined call: a big kernel inlines its helpers thousands of times
        if fast.single_assigned is None:
            fast.single_assigned = frozenset(_single_assignments(fast.tree))
        self.single_assigned = fast.single_assigned
        if fast.rebound is None:
            fast.rebound = frozenset(_rebound_names(fast.tree))
        self.rebound = fast.rebound
        self._stmt_table, self._expr_table = STATEMENTS, EXPRESSIONS

    # --- dispatch: the one choke point for errors ----------------------------------------------
    @property
    def b(self) -> ir.IRBuilder:
        return self.ctx.builder

    def error(self, node, message, hint=None) -> KernelSourceError:
        return self.fast.error(node, message, hint)

    def stmt(self, node):
        handler = self._stmt_table.get(type(node))
        if handler is None:
            raise self.unsupported(node)
        self.ctx.set_location(self, node)
        try:
            handler(self, node)
        except KernelSourceError:
            raise
        except Exception as exc:   # noqa: BLE001 - every failure gets the node's location
            raise self.wrap_exception(node, exc) from None

    def expr(self, node):
        handler = self._expr_table.get(type(node))
        if handler is None:
            raise self.unsupported(node)
        try:
            return handler(self, node)
        except KernelSourceError:
            raise
        except Exception as exc:   # noqa: BLE001 - every failure gets the node's location
            raise self.wrap_exception(node, exc) from None

    def wrap_exception(self, node, exc) -> KernelSourceError:
        """Any non-KernelSourceError raised while lowering `node` (the innermost node that
        failed: inner visits wrap first) as a located KernelSourceError. A TypeMismatch is a
        user error with its own hint; Python's own refusals (a negative shift, a string
        where a float goes, an int too big for C) are user errors too, said plainly; anything
        else is our bug, reported at the construct so the user can work around it."""
        if isinstance(exc, ops.TypeMismatch):
            return self.error(node, str(exc), exc.hint)
        construct = CONSTRUCTS.get(type(node), type(node).__name__)
        if isinstance(exc, (ValueError, TypeError, OverflowError, ZeroDivisionError)):
            return self.error(node, f"invalid {construct}: {exc}")
        return self.error(node, f"internal error while lowering {construct}: "
                          f"{type(exc).__name__}: {exc}")

    def unsupported(self, node) -> KernelSourceError:
        what = UNSUPPORTED.get(type(node), type(node).__name__)
        return self.error(node, f"{what} are not supported in kernels"
                          if what.endswith("s") and what[0].islower() else
                          f"{what} is not supported in kernels")

    def body(self, stmts):
        for s in stmts:
            if self.b.block.is_terminated:
                # Code after return/break/continue is unreachable: keep it out of the IR.
                self.ctx.new_block("dead")
            self.stmt(s)

    # --- names ---------------------------------------------------------------------------------
    def lookup(self, name: str, node):
        if name in self.vars:
            entry = self.vars[name]
            if isinstance(entry, tuple) and entry[0] == "slot":
                _, slot, ty = entry
                if isinstance(ty, PtrType):
                    origin = slot_origin(self, self.ctx.origins.get(id(slot)))
                    return PtrValue(ty, self.b.load(slot), origin)
                raw = self.b.load(slot)
                return Value(ty, raw)
            return entry
        for scope in (self.fast.closure, self.fast.globals):
            if name in scope:
                obj = scope[name]
                if isinstance(obj, (list, dict, set, bytearray, np.ndarray)) or (
                        hasattr(obj, "__dlpack__") and not isinstance(obj, np.generic)):
                    raise self.error(node, f"'{name}' is a Python {type(obj).__name__}: kernels "
                                     "cannot read mutable Python objects",
                                     hint="pass the data as a Ptr argument (pk.to_device), or "
                                          "a value as a Const parameter")
                return self.wrap_global(obj, node)
        if hasattr(builtins, name):
            return GlobalRef(getattr(builtins, name))
        raise self.error(node, f"name '{name}' is not defined")

    def wrap_global(self, obj, node):
        if isinstance(obj, np.generic) and isinstance(obj, (np.integer, np.floating, np.bool_)):
            obj = obj.item()                    # numpy scalars are constants like Python ones
        if isinstance(obj, bool) or isinstance(obj, (int, float)):
            return ConstValue(obj)
        if isinstance(obj, ScalarType):
            return TypeValue(obj)
        lower_global = getattr(type(obj), "lower_global", None)   # e.g. pk.const_array tables
        if lower_global is not None:
            return lower_global(obj, self, node)
        return GlobalRef(obj)

    def assign_name(self, name: str, val, node):
        """Bind `name` to a value: first assignment fixes the variable's type."""
        if isinstance(val, (ConstValue,)):
            existing = self.vars.get(name)
            if existing is None and name in self.single_assigned and \
                    isinstance(val.value, (bool, int, float)):
                # Assigned once from compile-time values (e.g. `NCH = D // 32` with D a Const):
                # stays a compile-time constant, usable in static_range / shared_array sizes.
                self.vars[name] = val
                return
            if isinstance(existing, tuple):
                val = self.coerce(val, existing[2], node)
            elif existing is None or isinstance(existing, ConstValue):
                val = self.materialize(val, node)
                self.literal_typed.setdefault(name, node)
        if isinstance(val, (TupleValue, TypeValue, GlobalRef, ArrayValue, NdArrayValue)):
            if name in self.vars and isinstance(self.vars[name], tuple):
                raise self.error(node, f"'{name}' holds a scalar; cannot rebind it to "
                                 f"{type(val).__name__}")
            self.vars[name] = val
            return
        ty = val.ty
        entry = self.vars.get(name)
        if not (isinstance(entry, tuple) and entry[0] == "slot"):
            if entry is not None and not isinstance(entry, (ConstValue,)):
                raise self.error(node, f"cannot assign to '{name}' here")
            slot = self.ctx.alloca(ty.llvm if isinstance(ty, ScalarType)
                                   else self.ctx.ptr_llvm(ty), name)
            entry = ("slot", slot, ty)
            self.vars[name] = entry
            if isinstance(val, PtrValue):
                # bound at several places: which memory it points into is known at run time
                self.ctx.origins[id(slot)] = (BoundSlots(self, name) if name in self.rebound
                                              and tracks(self) else val.origin)
        _, slot, declared = entry
        if declared != ty:
            raise self.error(node, f"'{name}' was first assigned a {declared}; cannot assign a "
                             f"{ty} (a variable keeps one type)",
                             hint=f"convert explicitly, e.g. {declared}(...)"
                             if isinstance(declared, ScalarType) else None)
        self.b.store(val.ir, slot)
        bounds = self.ctx.origins.get(id(slot))
        if isinstance(bounds, BoundSlots):
            bounds.store(self, val.origin)

    # --- conversions ---------------------------------------------------------------------------
    def materialize(self, val, node):
        """A runtime Value for a compile-time constant (int -> i32/i64, float -> f32)."""
        if isinstance(val, ConstValue):
            if not isinstance(val.value, (bool, int, float)):
                raise self.error(node, f"a {type(val.value).__name__} cannot be used as a "
                                 f"value in a kernel")
            ty = ops.literal_type(val.value)
            return Value(ty, ops.const_ir(ty, val.value))
        return val

    def coerce(self, val, ty, node):
        """Make `val` a runtime value of type `ty`: literals adapt, runtime values must match."""
        if isinstance(val, ConstValue):
            if isinstance(ty, ScalarType):
                return Value(ty, ops.const_ir(ty, val.value))
            raise self.error(node, f"expected a {ty}, got the constant {val.value!r}")
        if isinstance(val, Value) and isinstance(ty, ScalarType):
            if val.ty != ty:
                raise self.error(node, f"expected {ty}, got {val.ty}",
                                 hint=f"convert explicitly, e.g. {ty}(...)")
            return val
        if isinstance(val, PtrValue) and isinstance(ty, PtrType):
            if val.ty.elem != ty.elem or val.ty.space != ty.space:
                raise self.error(node, f"expected {ty}, got {val.ty}")
            return val
        raise self.error(node, f"expected {ty}, got {describe(val)}")

    def truth(self, val, node):
        """An i1 for a condition (ints and floats test != 0, as in C)."""
        val = self.materialize(val, node)
        if not isinstance(val, Value):
            raise self.error(node, f"{describe(val)} cannot be used as a condition")
        if val.ty is bool_:
            return val.ir
        return ops.cast(self.b, val.ty, bool_, val.ir)


def _single_assignments(tree) -> set:
    """Names bound exactly once in the function body, by a plain `name = ...` (not augmented,
    not a loop variable, not a tuple target). A subscript or attribute target (`a[i] = v`)
    binds no name: the names in it are read, not assigned."""
    return {name for name, c in _binding_counts(tree).items() if c == 1}


def _rebound_names(tree) -> set:
    """Names bound at more than one place (a parameter is bound by the call): a pointer such
    a name holds is chosen at run time, so its bounds travel with it (ptr_bounds.py)."""
    counts = _binding_counts(tree)
    for arg in tree.args.args:
        counts[arg.arg] = counts.get(arg.arg, 0) + 1
    return {name for name, c in counts.items() if c > 1}


def _binding_counts(tree) -> dict:
    """name -> how many places bind it; loop, augmented and tuple targets count twice."""
    import ast as _ast
    counts: dict = {}
    for node in _ast.walk(tree):
        targets = []
        if isinstance(node, _ast.Assign):
            for t in node.targets:
                targets += [t.id] if isinstance(t, _ast.Name) else _bound_names(t) * 2
        elif isinstance(node, (_ast.AugAssign, _ast.AnnAssign, _ast.For)):
            targets += _bound_names(node.target) * 2
        for name in targets:
            counts[name] = counts.get(name, 0) + 1
    return counts


def _bound_names(target) -> list:
    """The names an assignment target rebinds (none for `a[i]` or `a.x`)."""
    import ast as _ast
    if isinstance(target, _ast.Name):
        return [target.id]
    if isinstance(target, (_ast.Tuple, _ast.List)):
        return [name for elt in target.elts for name in _bound_names(elt)]
    if isinstance(target, _ast.Starred):
        return _bound_names(target.value)
    return []
