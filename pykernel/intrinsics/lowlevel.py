"""Low-level intrinsics: dp4a (4-way int8 dot product), tensor-core mma.sync tiles (f16, bf16,
s8, and 1-bit AND-popcount), movmatrix and `pk.asm` inline PTX: the arguments checked here, the
instructions from the target's table (targets/nvptx_intrinsics.py; mma and movmatrix are
warp-collective, and the CPU target emulates them exactly in targets/cpu_intrinsics.py)."""
from __future__ import annotations

import ast

from llvmlite import ir

from ..lower.values import ConstValue, TupleValue, TypeValue, Value, describe
from ..types import f32, i32, u32
from .base import intrinsic

I32, I8 = ir.IntType(32), ir.IntType(8)


@intrinsic("dp4a")
def dp4a(fl, node):
    """`pk.dp4a(a, b, c)`: c + sum of the 4 byte products of a and b (`dp4a.s32.s32` for i32
    operands, `.u32` for u32; mixed signedness allowed). Result i32 (u32 if both unsigned)."""
    if len(node.args) != 3 or node.keywords:
        raise fl.error(node, "pk.dp4a(a, b, c) takes 3 arguments")
    a, b_, c = (fl.expr(x) for x in node.args)
    vals = []
    for v in (a, b_):
        v = v if not isinstance(v, ConstValue) else fl.coerce(v, i32, node)
        if not isinstance(v, Value) or v.ty not in (i32, u32):
            raise fl.error(node, f"pk.dp4a operands are i32 (signed bytes) or u32 (unsigned "
                           f"bytes), got {describe(v)}")
        vals.append(v)
    out_ty = u32 if all(v.ty is u32 for v in vals) else i32
    c = fl.coerce(c, out_ty, node) if not (isinstance(c, Value) and c.ty in (i32, u32)) else c
    signs = ["s" if v.ty is i32 else "u" for v in vals]
    lowered = fl.ctx.target.lower_intrinsic("dp4a", fl, vals, c, signs)
    if lowered is not None:
        return Value(out_ty, lowered)
    b, acc = fl.b, c.ir     # portable: the four byte products one by one
    for k in range(4):
        parts = []
        for v, s in zip(vals, signs):
            byte = b.trunc(b.lshr(v.ir, ir.Constant(I32, 8 * k)), I8)
            parts.append(b.sext(byte, I32) if s == "s" else b.zext(byte, I32))
        acc = b.add(acc, b.mul(parts[0], parts[1]))
    return Value(out_ty, acc)


# mma fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16/k32"): lane = 4*group+tig.
# name: (instruction, k, values per register, k parts, accumulator type). A k part is one A
# register pair (rows group, group + 8) and one B register, each lane holding per_reg
# consecutive k; part p covers k p*k/parts .. (p+1)*k/parts - 1. Registers: a (2 parts), b
# (parts), c (4).
MMA = {
    "m16n8k16_f16": ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", 16, 2, 2, f32),
    "m16n8k16_bf16": ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 16, 2, 2, f32),
    "m16n8k32_s8": ("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32", 32, 4, 2, i32),
    "m16n8k16_s8": ("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32", 16, 4, 1, i32),
}


def _mma(name):
    instr, ksize, per_reg, parts, acc_ty = MMA[name]
    a_names = ", ".join(f"a{k}" for k in range(2 * parts))
    b_names = ", ".join(f"b{k}" for k in range(parts))
    nregs = 3 * parts

    def lower(fl, node):
        if len(node.args) != nregs + 4 or node.keywords:
            raise fl.error(node, f"pk.mma_{name} takes {nregs + 4} arguments: {a_names}, "
                           f"{b_names}, c0..c3")
        fl.ctx.require_arch(80, f"mma.sync m16n8k{ksize} ({name.split('_')[1]})", fl, node)
        args = [fl.expr(x) for x in node.args]
        regs = [fl.coerce(v, u32, node) for v in args[:nregs]]
        accs = [fl.coerce(v, acc_ty, node) for v in args[nregs:]]
        fl.ctx.uses.add("warp")
        outs = fl.ctx.target.lower_intrinsic("mma", fl, node, name, MMA[name], regs, accs)
        return TupleValue(tuple(Value(acc_ty, o) for o in outs))
    lower.__doc__ = (f"`d0..d3 = pk.mma_{name}({a_names}, {b_names}, c0..c3)`: one `{instr}` "
                     f"(sm_80+).")
    return lower


mma_m16n8k16_f16 = intrinsic("mma_m16n8k16_f16")(_mma("m16n8k16_f16"))
mma_m16n8k16_bf16 = intrinsic("mma_m16n8k16_bf16")(_mma("m16n8k16_bf16"))
mma_m16n8k32_s8 = intrinsic("mma_m16n8k32_s8")(_mma("m16n8k32_s8"))
mma_m16n8k16_s8 = intrinsic("mma_m16n8k16_s8")(_mma("m16n8k16_s8"))

@intrinsic("mma_m16n8k128_b1")
def mma_m16n8k128_b1(fl, node):
    """`d0..d3 = pk.mma_m16n8k128_b1(a0, a1, b0, c0..c3)`: D = C + popc(A AND B) over k for a
    16x128-bit A and a 128x8-bit B (one `mma...m16n8k128...b1.b1.s32.and.popc`, sm_80+). Bit i
    of a0 = A[group][32 t + i], a1 the same for row group + 8; bit i of b0 = B[32 t + i][group];
    C/D as the other shapes (c0, c1: row group, cols 2t, 2t + 1; c2, c3: row group + 8)."""
    if len(node.args) != 7 or node.keywords:
        raise fl.error(node, "pk.mma_m16n8k128_b1 takes 7 arguments: a0, a1, b0, c0..c3")
    fl.ctx.require_arch(80, "mma.sync m16n8k128 (b1, and.popc)", fl, node)
    args = [fl.expr(x) for x in node.args]
    regs = [fl.coerce(v, u32, node) for v in args[:3]]
    accs = [fl.coerce(v, i32, node) for v in args[3:]]
    fl.ctx.uses.add("warp")
    outs = fl.ctx.target.lower_intrinsic("mma_b1", fl, node, regs, accs)
    return TupleValue(tuple(Value(i32, o) for o in outs))


@intrinsic("movmatrix")
def movmatrix(fl, node):
    """`pk.movmatrix(x)`: transpose an 8x8 matrix of 16-bit values held by the warp, one u32
    (two adjacent columns) per lane: lane 4*r + c/2 holds row r, columns c, c+1 before and
    row r of the transpose after (`movmatrix.sync.aligned.m8n8.trans.b16`, sm_75+)."""
    if len(node.args) != 1 or node.keywords:
        raise fl.error(node, "pk.movmatrix(x) takes one u32 argument")
    fl.ctx.require_arch(75, "movmatrix.sync.aligned.m8n8.trans.b16", fl, node)
    x = fl.coerce(fl.expr(node.args[0]), u32, node)
    fl.ctx.uses.add("warp")
    return Value(u32, fl.ctx.target.lower_intrinsic("movmatrix", fl, node, x))


@intrinsic("asm")
def asm(fl, node):
    """`pk.asm("add.s32 $0, $1, $2;", "=r,r,r", i32, a, b)`: inline PTX (GPU only). The result
    type is a scalar type, a tuple of types, or None; constraints follow LLVM's syntax."""
    if len(node.args) < 3:
        raise fl.error(node, "pk.asm(template, constraints, result_type, *args)")
    template, cons = (fl.expr(x) for x in node.args[:2])
    result_node = node.args[2]
    no_result = isinstance(result_node, ast.Constant) and result_node.value is None
    rtype = ConstValue(None) if no_result else fl.expr(result_node)
    if not (isinstance(template, ConstValue) and isinstance(template.value, str) and
            isinstance(cons, ConstValue) and isinstance(cons.value, str)):
        raise fl.error(node, "pk.asm needs a literal PTX template and constraint string")
    if not fl.ctx.target.has_intrinsic("asm"):
        raise fl.error(node, f"pk.asm (inline PTX) has no {fl.ctx.target.name.upper()}-target "
                       "equivalent",
                       hint="guard it with a Const flag, or use intrinsics that run everywhere")
    args = [fl.materialize(fl.expr(x), node) for x in node.args[3:]]
    for a in args:
        if not isinstance(a, Value):
            raise fl.error(node, f"pk.asm operands must be scalars, got {describe(a)}")
    rtypes = _result_types(fl, node, rtype)
    llvm_ret = ir.VoidType() if not rtypes else rtypes[0].llvm if len(rtypes) == 1 else \
        ir.LiteralStructType([t.llvm for t in rtypes])
    fnty = ir.FunctionType(llvm_ret, [a.ir.type for a in args])
    res = fl.ctx.target.lower_intrinsic("asm", fl, fnty, template.value, cons.value,
                                        [a.ir for a in args])
    if not rtypes:
        return ConstValue(None)
    if len(rtypes) == 1:
        return Value(rtypes[0], res)
    return TupleValue(tuple(Value(t, fl.b.extract_value(res, k)) for k, t in enumerate(rtypes)))


def _result_types(fl, node, rtype):
    if isinstance(rtype, ConstValue) and rtype.value is None:
        return []
    items = rtype.items if isinstance(rtype, TupleValue) else (rtype,)
    if not all(isinstance(t, TypeValue) for t in items):
        raise fl.error(node, "pk.asm result type must be a scalar type, a tuple of them, or None")
    return [t.ty for t in items]
