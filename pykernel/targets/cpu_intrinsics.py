"""The CPU target's forms of the warp-collective intrinsics (CPUTarget.INTRINSICS): the 32
lanes publish their operands through the warp-exchange slots (cpu_ops.exchange_words) and each
lane computes its own outputs exactly. Input: the operands intrinsics/ checked; output: IR
values. Intrinsics absent here use the portable IR written in intrinsics/; pk.fast.* and
pk.asm are absent, so the accurate functions run and inline PTX is an error."""
from __future__ import annotations

from llvmlite import ir

from ..lower import ops
from ..types import bf16, f16, f32
from . import cpu_abi as abi
from .cpu_collectives import INTRINSICS as COLLECTIVES

I16, I32, I64, F32 = ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
LDMATRIX_ROW_BYTES = 16


def _lane_coords(fl):
    """(first thread of this lane's warp, group = lane / 4, thread in group = lane % 4)."""
    b = fl.b
    tlin = fl.ctx.target_data["tlin"]
    lane = b.and_(tlin, ir.Constant(I32, 31))
    base = b.sub(tlin, lane)
    return base, b.lshr(lane, ir.Constant(I32, 2)), b.and_(lane, ir.Constant(I32, 3))


def mma(fl, node, name, shape, regs, accs):
    """mma fragments (intrinsics/lowlevel.py MMA): output c_k of lane 4 group + tig is row
    group (+ 8 for k >= 2), column 2 tig + k % 2, summed over the k parts of A and B. The lane
    publishes its registers and accumulators and waits for the warp here; the products are
    summed in the module's one function per shape (`_mma_function`), called from every site:
    inlined, they were most of a tensor-core kernel's IR (~2,500 instructions per site) and
    most of the time LLVM spent on it."""
    parts, acc_ty = shape[3], shape[4]
    site = fl.ctx.site(fl, node, f"mma {name}")
    target, b = fl.ctx.target, fl.b
    words = [b.zext(r.ir, I64) for r in regs]
    words += [b.zext(b.bitcast(a.ir, I32) if acc_ty is f32 else a.ir, I64) for a in accs]
    slots, half, _ = target.exchange_words(fl.ctx, words, site)
    base, group, tig = _lane_coords(fl)
    nregs = 3 * parts
    acc_in = [b.trunc(words[nregs + k], I32) for k in range(4)]
    if acc_ty is f32:
        acc_in = [b.bitcast(a, F32) for a in acc_in]
    fn = _mma_function(fl.ctx.module, name, shape, target.SLOT_WORDS)
    result = b.call(fn, [slots, half, base, group, tig] + acc_in)
    return [b.extract_value(result, k) for k in range(4)]


def _mma_function(module, name, shape, slot_words: int) -> ir.Function:
    """`(slots, half, warp base, group, tig, c0..c3) -> {c0..c3}`: this lane's four outputs,
    each its accumulator plus the k products in order (the same IR, per lane, as one
    mma.sync computes exactly)."""
    _, ksize, per_reg, parts, acc_ty = shape
    fname = f"__pk_mma_{name}_{ksize}_{per_reg}_{parts}_{acc_ty.name}"
    if fname in module.globals:
        return module.globals[fname]
    acc_ir = F32 if acc_ty is f32 else I32
    fn = ir.Function(module, ir.FunctionType(ir.LiteralStructType([acc_ir] * 4),
                                             [I64.as_pointer()] + [I32] * 4 + [acc_ir] * 4),
                     fname)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    slots, half, base, group, tig = fn.args[:5]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    bits = 32 // per_reg
    kind = name.split("_")[1]

    def fetch(src_lane, w, part):
        idx = b.add(b.mul(b.add(half, b.add(base, src_lane)), ir.Constant(I32, slot_words)),
                    ir.Constant(I32, w))
        raw = b.trunc(b.load(b.gep(slots, [idx])), I32)
        piece = b.trunc(b.lshr(raw, ir.Constant(I32, bits * part)), ir.IntType(bits))
        if kind == "s8":
            return b.sext(piece, I32)
        return ops.to_f32(b, f16 if kind == "f16" else bf16,
                          b.bitcast(piece, ir.HalfType()) if kind == "f16" else piece)

    sub = ksize // parts      # k columns per part: A registers 2p (row group), 2p + 1, B p
    result = ir.Constant(fn.function_type.return_type, ir.Undefined)
    for k_out in range(4):    # c0, c1: row=group; c2, c3: row=group+8; col = 2*tig + k_out%2
        row_hi = k_out >= 2
        col = b.add(b.mul(tig, ir.Constant(I32, 2)), ir.Constant(I32, k_out % 2))
        acc = fn.args[5 + k_out]
        for k in range(ksize):
            a_lane = b.add(b.mul(group, ir.Constant(I32, 4)),
                           ir.Constant(I32, (k % sub) // per_reg))
            a_reg = int(row_hi) + 2 * (k // sub)
            b_lane = b.add(b.mul(col, ir.Constant(I32, 4)), ir.Constant(I32, (k % sub) // per_reg))
            b_reg = 2 * parts + k // sub
            x = fetch(a_lane, a_reg, k % per_reg)
            y = fetch(b_lane, b_reg, k % per_reg)
            acc = b.fadd(acc, b.fmul(x, y)) if acc_ty is f32 else b.add(acc, b.mul(x, y))
        result = b.insert_value(result, acc, k_out)
    b.ret(result)
    return fn


def mma_b1(fl, node, regs, accs):
    """Each lane's 4 outputs from the warp's published fragments: for output (row, col), the
    4 lanes t = 0..3 of the row's group hold A's k-words, those of col's group hold B's."""
    site = fl.ctx.site(fl, node, "mma b1")
    target, b = fl.ctx.target, fl.b
    words = [b.zext(v.ir, I64) for v in regs + accs]
    slots, half, _ = target.exchange_words(fl.ctx, words, site)
    base, group, tig = _lane_coords(fl)
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


def movmatrix(fl, node, x):
    """This lane's row of the transpose: (M[2t][g], M[2t+1][g]); M[r][c] is half c % 2 of the
    word lane 4r + c/2 published."""
    site = fl.ctx.site(fl, node, "movmatrix")
    target, b = fl.ctx.target, fl.b
    slots, half, _ = target.exchange_words(fl.ctx, [b.zext(x.ir, I64)], site)
    base, group, tig = _lane_coords(fl)
    shift = b.mul(b.and_(group, ir.Constant(I32, 1)), ir.Constant(I32, 16))
    halves = []
    for k in range(2):
        row = b.add(b.mul(tig, ir.Constant(I32, 2)), ir.Constant(I32, k))
        src = b.add(b.mul(row, ir.Constant(I32, 4)), b.lshr(group, ir.Constant(I32, 1)))
        word = target.fetch_word(fl.ctx, slots, half, b.add(base, src), 0)
        halves.append(b.and_(b.lshr(word, shift), ir.Constant(I32, 0xFFFF)))
    return b.or_(halves[0], b.shl(halves[1], ir.Constant(I32, 16)))


def ldmatrix(fl, node, row, count: int, transposed: bool):
    """Lane 4g + t, word j: halves (g, 2t), (g, 2t + 1) of tile j, or (2t, g), (2t + 1, g)
    transposed; tile j's row r lives at the address lane 8j + r published (each lane's own
    row bounds-checked)."""
    site = fl.ctx.site(fl, node, "out-of-bounds ldmatrix row")
    target, b = fl.ctx.target, fl.b
    mine = target.check_address(fl.ctx, row.ptr, row.elem, row.origin, site,
                                LDMATRIX_ROW_BYTES)
    slots, half, _ = target.exchange_words(fl.ctx, [b.ptrtoint(mine, I64)], site)
    base, group, tig = _lane_coords(fl)
    halves_ptr = I16.as_pointer()

    def half_at(tile: int, r, c):
        owner = b.add(base, b.add(ir.Constant(I32, 8 * tile), r))
        addr = target.fetch_word(fl.ctx, slots, half, owner, 0, width=64)
        ptr = b.gep(b.inttoptr(addr, halves_ptr), [c])
        return b.zext(b.load(ptr, align=2), I32)

    words = []
    for tile in range(count):
        parts = []
        for k in range(2):
            pair = b.add(b.mul(tig, ir.Constant(I32, 2)), ir.Constant(I32, k))
            parts.append(half_at(tile, pair, group) if transposed else half_at(tile, group, pair))
        words.append(b.or_(parts[0], b.shl(parts[1], ir.Constant(I32, 16))))
    return words


def grid_sync(fl, node, site):
    """Every block of the grid lives at once (the runtime runs the whole grid as one cluster
    of coroutines, cpu_runner.cluster_entry): a grid-wide barrier is a cluster barrier."""
    fl.ctx.uses.add("cluster_together")
    fl.ctx.target.suspend(fl.ctx, abi.AT_CLUSTER, site)


INTRINSICS = {"mma": mma, "mma_b1": mma_b1, "movmatrix": movmatrix, "ldmatrix": ldmatrix,
              "grid_sync": grid_sync, **COLLECTIVES}
