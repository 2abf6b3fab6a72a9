"""The NVPTX target's forms of the Hopper intrinsics (intrinsics/wgmma.py, intrinsics/fp8.py):
inline PTX (PTX ISA 8.0 for sm_90a). Input: the operands the intrinsics checked; output: IR.

wgmma's accumulators live in a pk.local_array: they are loaded, passed through the instruction
as tied in/out registers ("+f" in CUDA terms) and stored back, so with constant indices SROA
keeps them in registers across the K loop."""
from __future__ import annotations

from llvmlite import ir

from ..types import ScalarType, i32
from .nvptx_intrinsics import needs_ptx

I1, I16, I32, I64, F32 = (ir.IntType(1), ir.IntType(16), ir.IntType(32), ir.IntType(64),
                          ir.FloatType())


def _asm(fl, text, constraints, args, ret=None):
    fnty = ir.FunctionType(ret or ir.VoidType(), [a.type for a in args])
    asm = ir.InlineAsm(fnty, text, constraints, side_effect=True)
    return fl.b.call(asm, args)


def shared_address(fl, ptr):
    """The 32-bit shared-window address of a shared pointer (addrspace 3)."""
    return fl.b.ptrtoint(ptr, I32)


def _element_ptrs(fl, acc):
    return [fl.b.gep(acc.ir, [ir.Constant(I32, k)]) for k in range(acc.ty.count)]


def wgmma(fl, node, spec, acc, a, b_desc, scale):
    """`{ setp.ne.b32 p, scale, 0; wgmma... {d..}, a, b, p[, 1, 1[, 0, tb]]; }`: imm-scale-a/b
    (f16, bf16, fp8) are 1, imm-trans-a (f16, bf16) 0 (a K-major A), imm-trans-b tb =
    spec.trans_b (0: B K-major, 1: N-major). Mixed integer operands (s8.u8) need PTX ISA
    8.4."""
    needs_ptx(fl, 84 if spec.family == "int8" and spec.a_kind != spec.b_kind else 80)
    b = fl.b
    count = acc.ty.count
    reg = "r" if spec.acc_ty is i32 else "f"
    ty = I32 if spec.acc_ty is i32 else F32
    ptrs = _element_ptrs(fl, acc)
    olds = [b.load(p) for p in ptrs]
    outs = ", ".join(f"${k}" for k in range(count))
    args = list(olds)
    cons = [f"={reg}"] * count + [str(k) for k in range(count)]
    pos = 2 * count
    if isinstance(a.ty, ScalarType):          # a descriptor; else the 4 A-fragment registers
        a_text = f"${pos}"
        args.append(a.ir)
        cons.append("l")
        pos += 1
    else:
        regs = [b.load(b.gep(a.ir, [ir.Constant(I32, k)])) for k in range(4)]
        a_text = "{" + ", ".join(f"${pos + k}" for k in range(4)) + "}"
        args += regs
        cons += ["r"] * 4
        pos += 4
    from_registers = a_text.startswith("{")
    args += [b_desc.ir, b.zext(scale.ir, I32)]
    cons += ["l", "r"]
    tail = ""
    if spec.family in ("f16", "bf16"):      # imm-trans-b: 1 for an N-major B
        trans_b = int(spec.trans_b)
        tail = f", 1, 1, {trans_b}" if from_registers else f", 1, 1, 0, {trans_b}"
    elif spec.family == "fp8":
        tail = ", 1, 1"
    text = (f"{{ .reg .pred p; setp.ne.b32 p, ${pos + 1}, 0; {spec.ptx} {{{outs}}}, "
            f"{a_text}, ${pos}, p{tail}; }}")
    ret = ir.LiteralStructType([ty] * count)
    res = _asm(fl, text, ",".join(cons) + ",~{memory}", args, ret)
    for k, p in enumerate(ptrs):
        b.store(b.extract_value(res, k), p)
    return True


def wgmma_fence(fl):
    needs_ptx(fl, 80)
    _asm(fl, "wgmma.fence.sync.aligned;", "~{memory}", [])
    return True


def wgmma_commit_group(fl):
    needs_ptx(fl, 80)
    _asm(fl, "wgmma.commit_group.sync.aligned;", "~{memory}", [])
    return True


def wgmma_wait_group(fl, count, accs):
    """The wait, then each accumulator register through an empty asm that reads and writes it:
    reads of the accumulators cannot be scheduled above the wait."""
    needs_ptx(fl, 80)
    _asm(fl, f"wgmma.wait_group.sync.aligned {count};", "~{memory}", [])
    b = fl.b
    for acc in accs:
        ty = acc.ty.elem.llvm
        reg = "f" if isinstance(ty, ir.FloatType) else ("l" if ty.width == 64 else "r")
        for p in _element_ptrs(fl, acc):
            pinned = _asm(fl, "", f"={reg},0", [b.load(p)], ret=ty)
            b.store(pinned, p)
    return True


def setmaxnreg(fl, direction, count, _node):
    needs_ptx(fl, 80)
    _asm(fl, f"setmaxnreg.{direction}.sync.aligned.u32 {count};", "~{memory}", [])
    return True


HOPPER_INTRINSICS = {"shared_address": shared_address, "wgmma": wgmma,
                     "wgmma_fence": wgmma_fence, "wgmma_commit_group": wgmma_commit_group,
                     "wgmma_wait_group": wgmma_wait_group, "setmaxnreg": setmaxnreg}


def fp8_encode(fl, value, fmt):
    """`cvt.rn.satfinite.{fmt}x2.f32 d, 0, x` (sm_89+): the low byte is x's code."""
    if fl.ctx.target.sm < 89:
        return None
    needs_ptx(fl, 81 if fl.ctx.target.sm == 89 else 78)   # sm_89's fp8 cvt: PTX ISA 8.1
    pair = _asm(fl, f"cvt.rn.satfinite.{fmt}x2.f32 $0, 0f00000000, $1;", "=h,f", [value],
                ret=I16)
    return fl.b.trunc(pair, ir.IntType(8))


def fp8_decode(fl, code, fmt):
    """`cvt.rn.f16x2.{fmt}x2 d, {0, code}` (sm_89+), then the low f16 to f32 (exact)."""
    if fl.ctx.target.sm < 89:
        return None
    needs_ptx(fl, 81 if fl.ctx.target.sm == 89 else 78)   # sm_89's fp8 cvt: PTX ISA 8.1
    b = fl.b
    pair = _asm(fl, f"cvt.rn.f16x2.{fmt}x2 $0, $1;", "=r,h", [b.zext(code, I16)], ret=I32)
    half = b.bitcast(b.trunc(pair, I16), ir.HalfType())
    return b.fpext(half, F32)


HOPPER_INTRINSICS.update(fp8_encode=fp8_encode, fp8_decode=fp8_decode)
