"""NVPTX forms of the memory-ordered accesses (intrinsics/memorder.py): one PTX instruction
each, as inline asm on the generic address (so global and shared pointers share one form):
`ld.acquire.gpu.b32`, `st.release.gpu.b64`, `atom.acq_rel.gpu.add.u32`, `fence.sc.gpu`.
Inline asm rather than LLVM atomics with a syncscope: llvmlite's atomic loads and stores carry
no syncscope, and the instruction written here is the one the docs promise. Every form
clobbers memory, so LLVM keeps the accesses around it on their side."""
from __future__ import annotations

from llvmlite import ir

I64 = ir.IntType(64)
# bits -> PTX register constraint of an integer / float operand
_REGISTER = {32: "r", 64: "l"}
_FLOAT_REGISTER = {32: "f", 64: "d"}


def _generic_address(b, ptr):
    """The 64-bit generic address of a global, shared or generic pointer."""
    if ptr.type.addrspace != 0:
        ptr = b.addrspacecast(ptr, ir.PointerType(ptr.type.pointee))
    return b.ptrtoint(ptr, I64)


def _asm(b, ret, template, constraints, operands):
    args = [o.type for o in operands]
    fn = ir.FunctionType(ret, args)
    clobbers = ",".join(c for c in (constraints, "~{memory}") if c)
    return b.call(ir.InlineAsm(fn, template, clobbers, side_effect=True), operands)


def ordered_load(fl, ptr, elem, order, scope):
    """`ld.<order>.<scope>.b<bits> %r, [addr]` (bits of a float are bitcast back)."""
    b, bits = fl.b, elem.bits
    raw = _asm(b, ir.IntType(bits), f"ld.{order}.{scope}.b{bits} $0, [$1];",
               f"={_REGISTER[bits]},l", [_generic_address(b, ptr)])
    return b.bitcast(raw, elem.llvm) if elem.is_float else raw


def ordered_store(fl, ptr, elem, value, order, scope):
    """`st.<order>.<scope>.b<bits> [addr], %r`."""
    b, bits = fl.b, elem.bits
    word = b.bitcast(value, ir.IntType(bits)) if elem.is_float else value
    ret = ir.VoidType()
    _asm(b, ret, f"st.{order}.{scope}.b{bits} [$0], $1;", f"l,{_REGISTER[bits]}",
         [_generic_address(b, ptr), word])


def _atom_type(op, elem):
    if op in ("exch", "cas"):
        return f"b{elem.bits}"
    if elem.is_float:
        return f"f{elem.bits}"
    if op == "add" and elem.bits == 64:
        return "u64"            # PTX has no atom.add.s64; two's complement adds alike
    return f"{'s' if elem.is_signed else 'u'}{elem.bits}"


def ordered_atomic(fl, op, ptr, vals, elem, order, scope):
    """`atom.<order>.<scope>.<op>.<type> %old, [addr], v` (cas: `, compare, v`)."""
    b, bits = fl.b, elem.bits
    reg = (_FLOAT_REGISTER if elem.is_float else _REGISTER)[bits]
    values = ", ".join(f"${k + 2}" for k in range(len(vals)))
    template = f"atom.{order}.{scope}.{op}.{_atom_type(op, elem)} $0, [$1], {values};"
    return _asm(b, elem.llvm, template, ",".join([f"={reg}", "l"] + [reg] * len(vals)),
                [_generic_address(b, ptr)] + list(vals))


def ordered_fence(fl, order, scope):
    """`fence.acq_rel.<scope>` / `fence.sc.<scope>`."""
    _asm(fl.b, ir.VoidType(), f"fence.{order}.{scope};", "", [])


INTRINSICS = {"ordered_load": ordered_load, "ordered_store": ordered_store,
              "ordered_atomic": ordered_atomic, "ordered_fence": ordered_fence}
