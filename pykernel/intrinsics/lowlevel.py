"""Low-level intrinsics: dp4a (4-way int8 dot product), tensor-core mma.sync tiles (f16, bf16,
s8, and 1-bit AND-popcount), movmatrix and `pk.asm` inline PTX. mma is warp-collective: on the
CPU target the 32 lanes publish their fragments through the warp-exchange slots and each lane
computes its own outputs exactly."""
from __future__ import annotations

import ast

from llvmlite import ir

from ..lower.codegen import describe
from ..lower.values import ConstValue, TupleValue, TypeValue, Value
from ..types import f32, i32, u32
from .base import intrinsic

I32, I64, I8, F32 = ir.IntType(32), ir.IntType(64), ir.IntType(8), ir.FloatType()


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
    b = fl.b
    if fl.ctx.target.name == "nvptx":
        fn = fl.ctx.intrinsic_decl(f"llvm.nvvm.idp4a.{signs[0]}.{signs[1]}", ret=I32,
                                   args=(I32, I32, I32))
        return Value(out_ty, b.call(fn, [vals[0].ir, vals[1].ir, c.ir]))
    acc = c.ir
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
        if fl.ctx.target.name == "nvptx":
            outs = _mma_ptx(fl, instr, parts, regs, accs, acc_ty)
        else:
            site = fl.ctx.site(fl, node, f"mma {name}")
            outs = _mma_cpu(fl, name, ksize, per_reg, parts, regs, accs, acc_ty, site)
        return TupleValue(tuple(Value(acc_ty, o) for o in outs))
    lower.__doc__ = (f"`d0..d3 = pk.mma_{name}({a_names}, {b_names}, c0..c3)`: one `{instr}` "
                     f"(sm_80+).")
    return lower


def _mma_ptx(fl, instr, parts, regs, accs, acc_ty):
    ct = "f" if acc_ty is f32 else "r"
    acc_llvm = F32 if acc_ty is f32 else I32
    ret = ir.LiteralStructType([acc_llvm] * 4)
    fnty = ir.FunctionType(ret, [I32] * len(regs) + [acc_llvm] * 4)

    def operands(first, count):
        return "{" + ",".join(f"${first + k}" for k in range(count)) + "}"
    na = 2 * parts
    text = (f"{instr} {operands(0, 4)}, {operands(4, na)}, {operands(4 + na, parts)}, "
            f"{operands(4 + 3 * parts, 4)};")
    cons = ",".join([f"={ct}"] * 4 + ["r"] * len(regs) + [ct] * 4)
    res = fl.b.asm(fnty, text, cons, [r.ir for r in regs] + [a.ir for a in accs], True)
    return [fl.b.extract_value(res, k) for k in range(4)]


def _mma_cpu(fl, name, ksize, per_reg, parts, regs, accs, acc_ty, site):
    from ..lower import ops
    from ..types import bf16, f16
    target, b = fl.ctx.target, fl.b
    words = [b.zext(r.ir, I64) for r in regs]
    words += [b.zext(b.bitcast(a.ir, I32) if acc_ty is f32 else a.ir, I64) for a in accs]
    slots, half, nt = target.exchange_words(fl.ctx, words, site)
    tlin = fl.ctx.target_data["tlin"]
    lane = b.and_(tlin, ir.Constant(I32, 31))
    base = b.sub(tlin, lane)
    group, tig = b.lshr(lane, ir.Constant(I32, 2)), b.and_(lane, ir.Constant(I32, 3))
    bits = 32 // per_reg
    kind = name.split("_")[1]

    def fetch(src_lane, w, part):
        raw = target.fetch_word(fl.ctx, slots, half, b.add(base, src_lane), w)
        piece = b.trunc(b.lshr(raw, ir.Constant(I32, bits * part)), ir.IntType(bits))
        if kind == "s8":
            return b.sext(piece, I32)
        return ops.to_f32(b, f16 if kind == "f16" else bf16,
                          b.bitcast(piece, ir.HalfType()) if kind == "f16" else piece)

    sub = ksize // parts      # k columns per part: A registers 2p (row group), 2p + 1, B p
    nregs = 3 * parts
    outs = []
    for k_out in range(4):    # c0, c1: row=group; c2, c3: row=group+8; col = 2*tig + k_out%2
        row_hi = k_out >= 2
        col = b.add(b.mul(tig, ir.Constant(I32, 2)), ir.Constant(I32, k_out % 2))
        acc = b.bitcast(b.trunc(words[nregs + k_out], I32), F32) if acc_ty is f32 else \
            b.trunc(words[nregs + k_out], I32)
        for k in range(ksize):
            a_lane = b.add(b.mul(group, ir.Constant(I32, 4)),
                           ir.Constant(I32, (k % sub) // per_reg))
            a_reg = int(row_hi) + 2 * (k // sub)
            b_lane = b.add(b.mul(col, ir.Constant(I32, 4)), ir.Constant(I32, (k % sub) // per_reg))
            b_reg = 2 * parts + k // sub
            x = fetch(a_lane, a_reg, k % per_reg)
            y = fetch(b_lane, b_reg, k % per_reg)
            acc = b.fadd(acc, b.fmul(x, y)) if acc_ty is f32 else b.add(acc, b.mul(x, y))
        outs.append(acc)
    return outs


mma_m16n8k16_f16 = intrinsic("mma_m16n8k16_f16")(_mma("m16n8k16_f16"))
mma_m16n8k16_bf16 = intrinsic("mma_m16n8k16_bf16")(_mma("m16n8k16_bf16"))
mma_m16n8k32_s8 = intrinsic("mma_m16n8k32_s8")(_mma("m16n8k32_s8"))
mma_m16n8k16_s8 = intrinsic("mma_m16n8k16_s8")(_mma("m16n8k16_s8"))

MMA_B1 = "mma.sync.aligned.m16n8k128.row.col.s32.b1.b1.s32.and.popc"


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
    b = fl.b
    if fl.ctx.target.name == "nvptx":
        fnty = ir.FunctionType(ir.LiteralStructType([I32] * 4), [I32] * 7)
        text = f"{MMA_B1} {{$0,$1,$2,$3}}, {{$4,$5}}, {{$6}}, {{$7,$8,$9,$10}};"
        res = b.asm(fnty, text, ",".join(["=r"] * 4 + ["r"] * 7),
                    [v.ir for v in regs + accs], True)
        outs = [b.extract_value(res, k) for k in range(4)]
    else:
        outs = _mma_b1_cpu(fl, regs, accs, fl.ctx.site(fl, node, "mma b1"))
    return TupleValue(tuple(Value(i32, o) for o in outs))


def _mma_b1_cpu(fl, regs, accs, site):
    """Each lane's 4 outputs from the warp's published fragments: for output (row, col), the
    4 lanes t = 0..3 of the row's group hold A's k-words, those of col's group hold B's."""
    target, b = fl.ctx.target, fl.b
    words = [b.zext(v.ir, I64) for v in regs + accs]
    slots, half, _ = target.exchange_words(fl.ctx, words, site)
    tlin = fl.ctx.target_data["tlin"]
    lane = b.and_(tlin, ir.Constant(I32, 31))
    base = b.sub(tlin, lane)
    group, tig = b.lshr(lane, ir.Constant(I32, 2)), b.and_(lane, ir.Constant(I32, 3))
    popc = fl.ctx.intrinsic_decl("llvm.ctpop", I32, ret=I32, args=(I32,))
    outs = []
    for k_out in range(4):
        col = b.add(b.mul(tig, ir.Constant(I32, 2)), ir.Constant(I32, k_out % 2))
        acc = b.trunc(words[3 + k_out], I32)
        for t in range(4):
            a_lane = b.add(b.add(base, b.mul(group, ir.Constant(I32, 4))), ir.Constant(I32, t))
            b_lane = b.add(b.add(base, b.mul(col, ir.Constant(I32, 4))), ir.Constant(I32, t))
            a_word = target.fetch_word(fl.ctx, slots, half, a_lane, k_out // 2)
            b_word = target.fetch_word(fl.ctx, slots, half, b_lane, 2)
            acc = b.add(acc, b.call(popc, [b.and_(a_word, b_word)]))
        outs.append(acc)
    return outs


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
    b = fl.b
    if fl.ctx.target.name == "nvptx":
        fnty = ir.FunctionType(I32, [I32])
        return Value(u32, b.asm(fnty, "movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;", "=r,r",
                                [x.ir], True))
    site = fl.ctx.site(fl, node, "movmatrix")
    target = fl.ctx.target
    slots, half, _ = target.exchange_words(fl.ctx, [b.zext(x.ir, I64)], site)
    tlin = fl.ctx.target_data["tlin"]
    lane = b.and_(tlin, ir.Constant(I32, 31))
    base = b.sub(tlin, lane)
    group, tig = b.lshr(lane, ir.Constant(I32, 2)), b.and_(lane, ir.Constant(I32, 3))
    # this lane's result: (M[2t][g], M[2t+1][g]); M[r][c] is half c%2 of lane 4r + c/2
    shift = b.mul(b.and_(group, ir.Constant(I32, 1)), ir.Constant(I32, 16))
    halves = []
    for k in range(2):
        row = b.add(b.mul(tig, ir.Constant(I32, 2)), ir.Constant(I32, k))
        src = b.add(b.mul(row, ir.Constant(I32, 4)), b.lshr(group, ir.Constant(I32, 1)))
        word = target.fetch_word(fl.ctx, slots, half, b.add(base, src), 0)
        halves.append(b.and_(b.lshr(word, shift), ir.Constant(I32, 0xFFFF)))
    return Value(u32, b.or_(halves[0], b.shl(halves[1], ir.Constant(I32, 16))))


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
    if fl.ctx.target.name != "nvptx":
        raise fl.error(node, "pk.asm (inline PTX) has no CPU-target equivalent",
                       hint="guard it with a Const flag, or use intrinsics that run everywhere")
    args = [fl.materialize(fl.expr(x), node) for x in node.args[3:]]
    for a in args:
        if not isinstance(a, Value):
            raise fl.error(node, f"pk.asm operands must be scalars, got {describe(a)}")
    rtypes = _result_types(fl, node, rtype)
    llvm_ret = ir.VoidType() if not rtypes else rtypes[0].llvm if len(rtypes) == 1 else \
        ir.LiteralStructType([t.llvm for t in rtypes])
    fnty = ir.FunctionType(llvm_ret, [a.ir.type for a in args])
    res = fl.b.asm(fnty, template.value, cons.value, [a.ir for a in args], True)
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
