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
bounds-checked: targets/cpu_intrinsics.py); every lane of the warp must reach the call, as on
the GPU.
"""
from __future__ import annotations

from ..lower.memory import element_pointer
from ..lower.values import ConstValue, TupleValue, Value
from ..types import u32
from .async_copy import _space
from .base import intrinsic


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
    words = fl.ctx.target.lower_intrinsic("ldmatrix", fl, node, row, count, transposed)
    vals = tuple(Value(u32, w) for w in words)
    return vals[0] if count == 1 else TupleValue(vals)
