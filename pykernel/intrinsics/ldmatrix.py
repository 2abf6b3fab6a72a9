"""`pk.ldmatrix`: the warp loads 8x8 tiles of 16-bit values from shared memory straight into
mma fragment layout (`ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16`, sm_75+).

    r0, r1, r2, r3 = pk.ldmatrix(tile, i)        # 4 tiles; lane l gives row l % 8 of tile l // 8
    b0, b1 = pk.ldmatrix(tile, i, 2, trans=True)     # 2 tiles, transposed

Each lane passes the element index i of one 16-byte row (8 halves) in the shared array `tile`:
lanes 8j .. 8j + 7 give rows 0..7 of tile j. Result word j of lane 4g + t is row g, halves
2t, 2t + 1 of tile j (an mma A/B fragment register); with trans, halves (row 2t, column g) and
(row 2t + 1, column g), i.e. the tile transposed, which turns a row-major V tile into the
B operand of P V without a transposing store. One instruction replaces 2-4 shared loads per
lane and every lane's row can be anywhere (padded rows avoid bank conflicts).

Rows must be 16-byte aligned. On the CPU target the lanes publish their row addresses through
the warp-exchange slots and each lane reads its halves from them (each lane's own row is
bounds-checked); every lane of the warp must reach the call, as on the GPU.
"""
from __future__ import annotations

from llvmlite import ir

from ..lower.memory import element_pointer
from ..lower.values import ConstValue, TupleValue, Value
from ..types import u32
from .async_copy import _space
from .base import intrinsic

I16, I32, I64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
ROW_BYTES = 16


@intrinsic("ldmatrix")
def ldmatrix(fl, node):
    """`pk.ldmatrix(tile, i, n=4, trans=False)`: n (1, 2 or 4) u32 fragment words (a tuple for
    n > 1) from the 8x8 16-bit tiles whose rows the warp's lanes address (see the module)."""
    if not 2 <= len(node.args) <= 3:
        raise fl.error(node, "pk.ldmatrix(tile, i, n=4, trans=False) takes 2 or 3 positional "
                       "arguments")
    opts = {"n": node.args[2]} if len(node.args) == 3 else {}
    for kw in node.keywords:
        if kw.arg not in ("n", "trans") or kw.arg in opts:
            raise fl.error(node, f"pk.ldmatrix() got an unexpected keyword '{kw.arg}'")
        opts[kw.arg] = kw.value
    n = fl.expr(opts["n"]) if "n" in opts else ConstValue(4)
    trans = fl.expr(opts["trans"]) if "trans" in opts else ConstValue(False)
    if not isinstance(n, ConstValue) or n.value not in (1, 2, 4):
        raise fl.error(node, "pk.ldmatrix: n (tiles) must be a compile-time 1, 2 or 4")
    if not isinstance(trans, ConstValue) or not isinstance(trans.value, (bool, int)):
        raise fl.error(node, "pk.ldmatrix: trans must be a compile-time bool")
    fl.ctx.require_arch(75, "ldmatrix.sync.aligned.m8n8", fl, node)
    if _space(fl.expr(node.args[0])) != "shared":
        raise fl.error(node.args[0], "pk.ldmatrix reads shared memory: tile must be a "
                       "pk.shared_array or pk.dynamic_shared pointer")
    row = element_pointer(fl, node, node.args[0], node.args[1])
    fl.ctx.uses.add("warp")
    count, transposed = n.value, bool(trans.value)
    if fl.ctx.target.name == "nvptx":
        words = _ldmatrix_ptx(fl, row, count, transposed)
    else:
        site = fl.ctx.site(fl, node, "out-of-bounds ldmatrix row")
        words = _ldmatrix_cpu(fl, row, count, transposed, site)
    vals = tuple(Value(u32, w) for w in words)
    return vals[0] if count == 1 else TupleValue(vals)


def _ldmatrix_ptx(fl, row, count: int, transposed: bool):
    b = fl.b
    outs = ",".join(f"${k}" for k in range(count))
    text = (f"ldmatrix.sync.aligned.m8n8.x{count}{'.trans' if transposed else ''}.shared.b16 "
            f"{{{outs}}}, [${count}];")
    ret = I32 if count == 1 else ir.LiteralStructType([I32] * count)
    # a side effect keeps it after the barrier / cp.async wait that made the tile valid
    res = b.asm(ir.FunctionType(ret, [I32]), text, ",".join(["=r"] * count + ["r"]),
                [b.ptrtoint(row.ptr, I32)], True)
    return [res] if count == 1 else [b.extract_value(res, k) for k in range(count)]


def _ldmatrix_cpu(fl, row, count: int, transposed: bool, site):
    """Lane 4g + t, word j: halves (g, 2t), (g, 2t + 1) of tile j, or (2t, g), (2t + 1, g)
    transposed; tile j's row r lives at the address lane 8j + r published."""
    target, b = fl.ctx.target, fl.b
    mine = target.check_address(fl.ctx, row.ptr, row.elem, row.origin, site, ROW_BYTES)
    slots, half, _ = target.exchange_words(fl.ctx, [b.ptrtoint(mine, I64)], site)
    tlin = fl.ctx.target_data["tlin"]
    lane = b.and_(tlin, ir.Constant(I32, 31))
    base = b.sub(tlin, lane)
    group, tig = b.lshr(lane, ir.Constant(I32, 2)), b.and_(lane, ir.Constant(I32, 3))
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
