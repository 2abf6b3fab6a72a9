"""The NVPTX target's forms of the intrinsics (NVPTXTarget.INTRINSICS): one PTX instruction or
NVVM intrinsic each. Input: the operands intrinsics/ checked; output: IR values. Intrinsics
absent here use the portable IR written in intrinsics/."""
from __future__ import annotations

from llvmlite import ir

from ..lower import ops
from ..types import f32

I32, I64, F32 = ir.IntType(32), ir.IntType(64), ir.FloatType()

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
# pk.fast name -> (PTX instruction, NVVM intrinsic or None for inline asm, pre-scale, post-scale)
FAST = {"exp2": ("ex2.approx.ftz.f32", "llvm.nvvm.ex2.approx.ftz.f", 1.0, 1.0),
        "exp": ("ex2.approx.ftz.f32", "llvm.nvvm.ex2.approx.ftz.f", LOG2E, 1.0),
        "log2": ("lg2.approx.ftz.f32", "llvm.nvvm.lg2.approx.ftz.f", 1.0, 1.0),
        "log": ("lg2.approx.ftz.f32", "llvm.nvvm.lg2.approx.ftz.f", 1.0, LN2),
        "rsqrt": ("rsqrt.approx.ftz.f32", "llvm.nvvm.rsqrt.approx.ftz.f", 1.0, 1.0),
        "sqrt": ("sqrt.approx.ftz.f32", "llvm.nvvm.sqrt.approx.ftz.f", 1.0, 1.0),
        "sin": ("sin.approx.ftz.f32", "llvm.nvvm.sin.approx.ftz.f", 1.0, 1.0),
        "cos": ("cos.approx.ftz.f32", "llvm.nvvm.cos.approx.ftz.f", 1.0, 1.0),
        "tanh": ("tanh.approx.f32", None, 1.0, 1.0)}
MMA_B1 = "mma.sync.aligned.m16n8k128.row.col.s32.b1.b1.s32.and.popc"


def dp4a(fl, vals, c, signs):
    """`dp4a.{s,u}32.{s,u}32` (NVVM idp4a)."""
    fn = fl.ctx.intrinsic_decl(f"llvm.nvvm.idp4a.{signs[0]}.{signs[1]}", ret=I32,
                               args=(I32, I32, I32))
    return fl.b.call(fn, [vals[0].ir, vals[1].ir, c.ir])


def needs_ptx(fl, version: int) -> None:
    """The module's .version rises to `version` (65: 6.5): each arch starts at the oldest PTX
    ISA that knows it (nvptx.PTX_VERSION), and the instruction emitted here needs a newer one."""
    target = fl.ctx.target
    target.min_ptx = max(target.min_ptx, version)


def mma(fl, node, name, shape, regs, accs):
    """One `mma.sync` (shape: intrinsics/lowlevel.py MMA): the 4 accumulator outputs."""
    needs_ptx(fl, 70)   # the m16n8 shapes (m16n8k8 6.5, the k16 / k32 ones 7.0)
    instr, _, _, parts, acc_ty = shape
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


def mma_b1(fl, node, regs, accs):
    needs_ptx(fl, 71)   # .and.popc
    b = fl.b
    fnty = ir.FunctionType(ir.LiteralStructType([I32] * 4), [I32] * 7)
    text = f"{MMA_B1} {{$0,$1,$2,$3}}, {{$4,$5}}, {{$6}}, {{$7,$8,$9,$10}};"
    res = b.asm(fnty, text, ",".join(["=r"] * 4 + ["r"] * 7), [v.ir for v in regs + accs], True)
    return [b.extract_value(res, k) for k in range(4)]


def movmatrix(fl, node, x):
    needs_ptx(fl, 78)
    fnty = ir.FunctionType(I32, [I32])
    return fl.b.asm(fnty, "movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;", "=r,r", [x.ir], True)


def ldmatrix(fl, node, row, count: int, transposed: bool):
    needs_ptx(fl, 65)
    b = fl.b
    outs = ",".join(f"${k}" for k in range(count))
    text = (f"ldmatrix.sync.aligned.m8n8.x{count}{'.trans' if transposed else ''}.shared.b16 "
            f"{{{outs}}}, [${count}];")
    ret = I32 if count == 1 else ir.LiteralStructType([I32] * count)
    # a side effect keeps it after the barrier / cp.async wait that made the tile valid
    res = b.asm(ir.FunctionType(ret, [I32]), text, ",".join(["=r"] * count + ["r"]),
                [b.ptrtoint(row.ptr, I32)], True)
    return [res] if count == 1 else [b.extract_value(res, k) for k in range(count)]


def inline_asm(fl, fnty, template: str, constraints: str, operands: list):
    """pk.asm: the template is PTX, which only this target accepts."""
    return fl.b.asm(fnty, template, constraints, operands, True)


def pack_f16x2(fl, vals):
    """One `cvt.rn.f16x2.f32` on sm_80+ for two f32; None (two cvt and a merge) otherwise."""
    if fl.ctx.target.sm < 80 or not all(v.ty is f32 for v in vals):
        return None
    fnty = ir.FunctionType(I32, [F32, F32])
    # the instruction's first source goes to the upper half
    return fl.b.asm(fnty, "cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f", [vals[0].ir, vals[1].ir],
                    False)


def prmt(fl, a, b, sel):
    fnty = ir.FunctionType(I32, [I32, I32, I32])
    return fl.b.asm(fnty, "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", [a.ir, b.ir, sel.ir], False)


def f16x2(fl, node, op: str, a, b):
    """`{add,sub,mul}.rn.f16x2` (sm_53+)."""
    fl.ctx.require_arch(53, f"{op}.rn.f16x2", fl, node)
    fnty = ir.FunctionType(I32, [I32, I32])
    return fl.b.asm(fnty, f"{op}.rn.f16x2 $0, $1, $2;", "=r,r,r", [a.ir, b.ir], False)


def fast_math(fl, name, ty, x):
    """pk.fast.<name>: the `.approx` instruction in f32 (f16/bf16 converted and back)."""
    instr, nvvm, pre, post = FAST[name]
    b = fl.b
    v = ops.cast(b, ty, f32, x.ir)
    if pre != 1.0:
        v = b.fmul(v, ir.Constant(F32, pre))
    fnty = ir.FunctionType(F32, [F32])
    if nvvm is not None:
        r = b.call(fl.ctx.intrinsic_decl(nvvm, ret=F32, args=(F32,)), [v])
    else:
        r = b.asm(fnty, f"{instr} $0, $1;", "=f,f", [v], False)
    if post != 1.0:
        r = b.fmul(r, ir.Constant(F32, post))
    return ops.cast(b, f32, ty, r)


def activemask(fl, node):
    """`activemask.b32`: a side effect keeps it where it is written (inside its branch)."""
    return fl.b.asm(ir.FunctionType(I32, []), "activemask.b32 $0;", "=r", [], True)


def match(fl, node, kind: str, mask, value):
    """`match.{any,all}.sync.b32/.b64` (NVVM): any -> mask; all -> (mask, i1)."""
    width = value.type.width
    if kind == "any":
        fn = fl.ctx.intrinsic_decl(f"llvm.nvvm.match.any.sync.i{width}", ret=I32,
                                   args=(I32, value.type))
        return fl.b.call(fn, [mask, value])
    ret = ir.LiteralStructType([I32, ir.IntType(1)])
    fn = fl.ctx.intrinsic_decl(f"llvm.nvvm.match.all.sync.i{width}p", ret=ret,
                               args=(I32, value.type))
    res = fl.b.call(fn, [mask, value])
    return fl.b.extract_value(res, 0), fl.b.extract_value(res, 1)


def redux(fl, node, op: str, signed: bool, mask, value):
    """`redux.sync.<op>.{u32,s32,b32}` (NVVM llvm.nvvm.redux.sync.*; sm_80+, checked by the
    caller)."""
    name = op if op not in ("min", "max") or signed else "u" + op
    fn = fl.ctx.intrinsic_decl(f"llvm.nvvm.redux.sync.{name}", ret=I32, args=(I32, I32))
    return fl.b.call(fn, [value, mask])


BAR_RED = {"popc": "bar.red.popc.u32 $0, 0, %p;",
           "and": "bar.red.and.pred %q, 0, %p; selp.u32 $0, 1, 0, %q;",
           "or": "bar.red.or.pred %q, 0, %p; selp.u32 $0, 1, 0, %q;"}


def barrier_reduce(fl, node, op: str, pred, site):
    """`bar.red.{popc,and,or}` (CUDA's __syncthreads_count / _and / _or): i32 result."""
    text = ("{ .reg .pred %p, %q; setp.ne.u32 %p, $1, 0; " + BAR_RED[op] + " }")
    word = fl.b.zext(pred, I32)
    return fl.b.asm(ir.FunctionType(I32, [I32]), text, "=r,r,~{memory}", [word], True)


def timer(fl, node, which: str):
    """`mov.u64 %clock64` / `%globaltimer`: volatile reads (side effect: never merged)."""
    reg = {"clock64": "%clock64", "globaltimer": "%globaltimer"}[which]
    return fl.b.asm(ir.FunctionType(I64, []), f"mov.u64 $0, {reg};", "=l", [], True)


def nanosleep(fl, node, ns):
    """`nanosleep.u32` (sm_70+)."""
    fl.b.asm(ir.FunctionType(ir.VoidType(), [I32]), "nanosleep.u32 $0;", "r", [ns], True)


def grid_sync(fl, node, site):
    """A grid-wide barrier (what cooperative groups' grid.sync() does): the block meets, its
    thread 0 adds to a counter in global memory and spins until the counter's top bit flips,
    the block meets again. Block 0 adds 2^31 - (blocks - 1), the others 1, so each barrier
    flips bit 31 and leaves the low bits as they were: no reset between barriers or launches.
    The launch must be cooperative (all blocks co-resident), which the runtime does."""
    ctx, b, target = fl.ctx, fl.b, fl.ctx.target
    counter = _grid_counter(ctx.module)
    target.barrier(ctx, site)
    sreg = target.special_register
    zero = ir.Constant(I32, 0)
    tid = b.or_(b.or_(sreg(ctx, "thread_idx", "x"), sreg(ctx, "thread_idx", "y")),
                sreg(ctx, "thread_idx", "z"))
    with b.if_then(b.icmp_unsigned("==", tid, zero)):
        blocks = b.mul(b.mul(sreg(ctx, "grid_dim", "x"), sreg(ctx, "grid_dim", "y")),
                       sreg(ctx, "grid_dim", "z"))
        bid = b.or_(b.or_(sreg(ctx, "block_idx", "x"), sreg(ctx, "block_idx", "y")),
                    sreg(ctx, "block_idx", "z"))
        first = b.sub(ir.Constant(I32, 0x80000000), b.sub(blocks, ir.Constant(I32, 1)))
        step = b.select(b.icmp_unsigned("==", bid, zero), first, ir.Constant(I32, 1))
        target.fence(ctx)                                   # the block's writes, then arrive
        old = b.atomic_rmw("add", counter, step, "monotonic")
        spin, done = (b.function.append_basic_block(n) for n in ("grid.spin", "grid.done"))
        b.branch(spin)
        b.position_at_end(spin)
        now = b.load_atomic(counter, "monotonic", 4)
        flipped = b.and_(b.xor(old, now), ir.Constant(I32, 0x80000000))
        b.cbranch(b.icmp_unsigned("!=", flipped, zero), done, spin)
        b.position_at_end(done)
        target.fence(ctx)                                   # then see the others' writes
    target.barrier(ctx, site)


def _grid_counter(module):
    gv = module.globals.get("__pk_grid_barrier")
    if gv is None:
        gv = ir.GlobalVariable(module, I32, "__pk_grid_barrier", addrspace=1)
        gv.initializer, gv.linkage, gv.align = ir.Constant(I32, 0), "internal", 4
    return gv


INTRINSICS = {"dp4a": dp4a, "mma": mma, "mma_b1": mma_b1, "movmatrix": movmatrix,
              "ldmatrix": ldmatrix, "asm": inline_asm, "pack_f16x2": pack_f16x2,
              "prmt": prmt, "f16x2": f16x2, "fast_math": fast_math,
              "activemask": activemask, "match": match, "redux": redux,
              "barrier_reduce": barrier_reduce, "timer": timer, "nanosleep": nanosleep,
              "grid_sync": grid_sync}
