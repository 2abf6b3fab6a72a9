"""Hopper warpgroup tensor-core instructions (sm_90a): `wgmma.mma_async`, its shared-memory
matrix descriptors, the fence / commit / wait that order it, and `setmaxnreg`.

    desc = pk.wgmma_desc(tile, i, lbo, sbo, swizzle)   u64 descriptor of the K-major operand
                                           starting at shared tile[i] (docs/language.md)
    pk.wgmma_fence()                       before the first wgmma that reads registers written
                                           since (accumulators, A fragments)
    pk.wgmma(acc, a, b_desc, kind, scale_d=1, trans_b=False)   acc (a pk.local_array of N/2
                                           f32 or i32) = A(64xK) * B(KxN) + (acc if scale_d
                                           else 0); a is a descriptor (u64) or a local_array
                                           of 4 u32 (A from registers); N = 2 * len(acc);
                                           trans_b (f16 / bf16): B N-major in shared memory
    pk.wgmma_commit_group()                close the group of wgmmas issued since the last one
    pk.wgmma_wait_group(n, acc...)         wait until at most n groups are pending; the named
                                           accumulator arrays are safe to read afterwards
    pk.setmaxnreg_inc(n) / _dec(n)         move this warpgroup's register budget to n (24..256,
                                           a multiple of 8): consumers grow, producers shrink
    pk.entry_registers(threads, blocks)    registers per thread a kernel with setmaxnreg and
                                           launch bounds (threads, blocks) starts with

All 128 threads of a warpgroup (4 consecutive warps, the first a multiple of 4) execute each
wgmma with the same descriptors. On the CPU target a wgmma computes at once (each thread its own
accumulators, from shared memory through the descriptor's layout and swizzle, or from its
warp's A fragments) with the products and sums of the existing mma emulation; fence, commit
and wait do nothing there. setmaxnreg keeps the hardware's books there (targets/cpu_regs.py):
every warp starts with entry_registers, a .dec gives registers to the block's pool, an .inc
waits until the pool has them, and an .inc that no warp can ever satisfy is reported (the GPU
waits for ever).

The register count at entry: ptxas gives a kernel that uses setmaxnreg exactly the most its
launch bounds allow (without both max_threads and min_blocks it cannot tell and ignores
setmaxnreg), so a block owns threads x entry_registers registers and the counts its warps move
to must add up to no more than that: 384 threads at 168 each allow 128 x 40 + 256 x 232, not
128 x 96 + 256 x 208 (65536 > 64512: the second consumer warpgroup's .inc never returns).
"""
from __future__ import annotations

from llvmlite import ir

from ..errors import ArchSpecificError
from ..lower.memory import element_pointer
from ..lower.values import ArrayValue, ConstValue, Value, describe
from ..targets.archs import entry_registers  # noqa: F401 (pk.entry_registers)
from ..types import bool_, f32, i32, u32, u64
from .async_copy import _space
from .base import args_of, intrinsic

# operand kind -> (k of one instruction, bytes per element, accumulator type, family)
OPERANDS = {"f16": (16, 2, f32, "f16"), "bf16": (16, 2, f32, "bf16"),
            "e4m3": (32, 1, f32, "fp8"), "e5m2": (32, 1, f32, "fp8"),
            "s8": (32, 1, i32, "int8"), "u8": (32, 1, i32, "int8")}
SWIZZLE_MODE = {0: 0, 128: 1, 64: 2, 32: 3}     # swizzle bytes -> descriptor bits 62..63
INT8_N = (8, 16, 24) + tuple(range(32, 257, 16))
FLOAT_N = tuple(range(8, 257, 8))
A_REGS = 4                                       # u32 A-fragment registers per thread
FIELD_LIMIT = 1 << 18                            # 14-bit fields of 16-byte units


def require_sm90a(fl, node, what):
    """wgmma and setmaxnreg exist only on sm_90a (not sm_90, not sm_100): a compile error
    naming sm_90a elsewhere; the CPU target (no arch) emulates them."""
    target = fl.ctx.target
    if target.sm is None:
        return
    if not (getattr(target, "arch_specific", False) and target.sm == 90):
        err = fl.fast.error(node, f"{what} needs sm_90a; compiling for {target.arch}",
                            hint="launch on an sm_90 device (the launcher compiles kernels "
                            "that use it for sm_90a) or compile with arch='sm_90a'")
        raise ArchSpecificError(err.message, err.file, err.line, err.col, err.end_col,
                                err.source_line, err.hint) from None
    fl.ctx.require_arch(90, what, fl, node)


def wgmma_kind(fl, node, kind_node):
    """'f16' or 'atype.btype' (s8.u8, e4m3.e5m2) -> (a operand, b operand)."""
    kind = fl.expr(kind_node)
    names = kind.value.split(".") if isinstance(kind, ConstValue) and \
        isinstance(kind.value, str) else []
    if len(names) == 1:
        names = names * 2
    if len(names) != 2 or any(n not in OPERANDS for n in names) or \
            OPERANDS[names[0]][3] != OPERANDS[names[1]][3]:
        raise fl.error(kind_node, "pk.wgmma: kind must be a string: 'f16', 'bf16', 'e4m3', "
                       "'e5m2', 's8', 'u8', or 'a.b' for mixed 8-bit operands (e.g. 's8.u8', "
                       f"'e4m3.e5m2'), got {describe(kind)}")
    return tuple(names)


def _accumulators(fl, node, acc_node, a_kind):
    k, _, acc_ty, family = OPERANDS[a_kind]
    acc = fl.expr(acc_node)
    if not (isinstance(acc, ArrayValue) and acc.ty.space == "local" and acc.ty.elem is acc_ty):
        raise fl.error(acc_node, f"pk.wgmma: the accumulators must be a pk.local_array({acc_ty}"
                       f", N // 2) for {a_kind}, got {describe(acc)}")
    n = 2 * acc.ty.count
    allowed = INT8_N if family == "int8" else FLOAT_N
    if n not in allowed:
        raise fl.error(acc_node, f"pk.wgmma: N = 2 * len(acc) = {n} is not an N of "
                       f"m64nNk{k}.{a_kind}; N is one of {', '.join(map(str, allowed))}")
    return acc, n


def _a_operand(fl, a_node):
    a = fl.expr(a_node)
    if isinstance(a, ArrayValue):
        if a.ty.space != "local" or a.ty.elem is not u32 or a.ty.count != A_REGS:
            raise fl.error(a_node, "pk.wgmma: A from registers is a pk.local_array(u32, 4) "
                           f"(the warp's m16 fragment), got {describe(a)}")
        return a
    if isinstance(a, Value) and a.ty is u64:
        return a
    raise fl.error(a_node, "pk.wgmma: A is a descriptor (u64, pk.wgmma_desc) or a "
                   f"pk.local_array(u32, 4) of A fragments, got {describe(a)}")


@intrinsic("wgmma")
def wgmma(fl, node):
    """`pk.wgmma(acc, a, b_desc, kind, scale_d=1)`: one `wgmma.mma_async.sync.aligned.
    m64nNkK.{f32|s32}.atype.btype` (sm_90a); see the module docstring and docs/language.md."""
    if not 4 <= len(node.args) <= 5 or any(kw.arg != "trans_b" for kw in node.keywords):
        raise fl.error(node, "pk.wgmma(acc, a, b_desc, kind, scale_d=1, trans_b=False) takes "
                       "4 or 5 positional arguments and the keyword trans_b")
    require_sm90a(fl, node, "wgmma.mma_async")
    kinds = wgmma_kind(fl, node, node.args[3])
    trans_b = _trans_b(fl, node, kinds[0])
    acc, n = _accumulators(fl, node, node.args[0], kinds[0])
    a = _a_operand(fl, node.args[1])
    b_desc = fl.coerce(fl.expr(node.args[2]), u64, node.args[2])
    scale = fl.expr(node.args[4]) if len(node.args) == 5 else ConstValue(1)
    if isinstance(scale, ConstValue):
        if scale.value not in (0, 1, False, True):
            raise fl.error(node.args[4], "pk.wgmma: scale_d is 0 (D = A*B) or 1 (D += A*B)")
        scale = Value(bool_, ir.Constant(ir.IntType(1), int(scale.value)))
    elif isinstance(scale, Value) and scale.ty in (i32, u32):
        scale = Value(bool_, fl.b.icmp_unsigned("!=", scale.ir, ir.Constant(scale.ir.type, 0)))
    elif not (isinstance(scale, Value) and scale.ty is bool_):
        raise fl.error(node.args[4], f"pk.wgmma: scale_d must be a bool or int, got "
                       f"{describe(scale)}")
    fl.ctx.uses.add("wgmma")
    if isinstance(a, ArrayValue):
        fl.ctx.uses.add("warp")      # the CPU target exchanges A fragments within the warp
    spec = WgmmaSpec(kinds[0], kinds[1], n, trans_b)
    done = fl.ctx.target.lower_intrinsic("wgmma", fl, node, spec, acc, a, b_desc, scale)
    if done is None:
        raise fl.error(node, "pk.wgmma is not available on this target")
    return ConstValue(None)


def _trans_b(fl, node, a_kind) -> bool:
    """The compile-time keyword trans_b (B N-major: imm-trans-b 1), f16 / bf16 only."""
    for kw in node.keywords:
        val = fl.expr(kw.value)
        if not isinstance(val, ConstValue) or val.value not in (0, 1, False, True):
            raise fl.error(kw.value, f"pk.wgmma: trans_b must be a compile-time bool, got "
                           f"{describe(val)}")
        if val.value and OPERANDS[a_kind][3] not in ("f16", "bf16"):
            raise fl.error(kw.value, f"pk.wgmma: trans_b (an N-major B) exists for f16 and "
                           f"bf16 only, not {a_kind}")
        return bool(val.value)
    return False


class WgmmaSpec:
    """One instruction's shape: m64 n{n} k{k}, operand kinds, accumulator type, and whether B
    is N-major (trans_b)."""

    def __init__(self, a_kind: str, b_kind: str, n: int, trans_b: bool = False):
        self.a_kind, self.b_kind, self.n, self.trans_b = a_kind, b_kind, n, trans_b
        self.k, self.elem_bytes, self.acc_ty, self.family = OPERANDS[a_kind]

    @property
    def ptx(self) -> str:
        acc = "s32" if self.acc_ty is i32 else "f32"
        return (f"wgmma.mma_async.sync.aligned.m64n{self.n}k{self.k}.{acc}."
                f"{self.a_kind}.{self.b_kind}")


def _desc_field(fl, arg_node, what):
    val = fl.expr(arg_node)
    if isinstance(val, ConstValue) and (not isinstance(val.value, int) or
                                        not 0 <= val.value < FIELD_LIMIT or val.value % 16):
        raise fl.error(arg_node, f"pk.wgmma_desc: {what} must be a multiple of 16 in "
                       f"0..{FIELD_LIMIT - 16} (bytes), got {val.value!r}")
    return fl.b.zext(fl.coerce(val, u32, arg_node).ir, ir.IntType(64))


@intrinsic("wgmma_desc")
def wgmma_desc(fl, node):
    """`pk.wgmma_desc(tile, i, lbo, sbo, swizzle)`: the 64-bit shared-memory matrix descriptor
    of the K-major operand at shared tile[i]: bits 0..13 address >> 4, 16..29 lbo >> 4 (bytes
    between core matrices along K), 32..45 sbo >> 4 (bytes between 8-row groups), 62..63 the
    swizzle mode (swizzle = 0, 32, 64 or 128 bytes)."""
    args_of(fl, node, 5, "wgmma_desc")
    if _space(fl.expr(node.args[0])) != "shared":
        raise fl.error(node.args[0], "pk.wgmma_desc describes shared memory: tile must be a "
                       "pk.shared_array or pk.dynamic_shared pointer")
    swz = fl.expr(node.args[4])
    if not isinstance(swz, ConstValue) or swz.value not in SWIZZLE_MODE:
        raise fl.error(node.args[4], "pk.wgmma_desc: swizzle must be a compile-time 0, 32, 64 "
                       "or 128 (bytes)")
    addr = element_pointer(fl, node, node.args[0], node.args[1])
    b, I64 = fl.b, ir.IntType(64)
    shared = fl.ctx.target.lower_intrinsic("shared_address", fl, addr.ptr)
    field = ir.Constant(I64, 0x3FFF)
    desc = b.and_(b.lshr(b.zext(shared, I64), ir.Constant(I64, 4)), field)
    lbo = _desc_field(fl, node.args[2], "lbo")
    sbo = _desc_field(fl, node.args[3], "sbo")
    desc = b.or_(desc, b.shl(b.and_(b.lshr(lbo, ir.Constant(I64, 4)), field),
                             ir.Constant(I64, 16)))
    desc = b.or_(desc, b.shl(b.and_(b.lshr(sbo, ir.Constant(I64, 4)), field),
                             ir.Constant(I64, 32)))
    desc = b.or_(desc, ir.Constant(I64, SWIZZLE_MODE[swz.value] << 62))
    return Value(u64, desc)


def _statement(name, what, doc):
    def lower(fl, node):
        args_of(fl, node, 0, name)
        require_sm90a(fl, node, what)
        fl.ctx.target.lower_intrinsic(name, fl)
        return ConstValue(None)
    lower.__doc__ = doc
    return intrinsic(name)(lower)


wgmma_fence = _statement("wgmma_fence", "wgmma.fence", "`pk.wgmma_fence()`: "
                         "`wgmma.fence.sync.aligned` (nothing on the CPU target).")
wgmma_commit_group = _statement("wgmma_commit_group", "wgmma.commit_group",
                                "`pk.wgmma_commit_group()`: `wgmma.commit_group.sync.aligned` "
                                "(nothing on the CPU target).")


@intrinsic("wgmma_wait_group")
def wgmma_wait_group(fl, node):
    """`pk.wgmma_wait_group(n, acc...)`: `wgmma.wait_group.sync.aligned n` (n a constant
    0..7); each named accumulator array is then pinned after the wait, so that no read of it
    moves above (CUTLASS's warpgroup_fence_operand). Nothing on the CPU target."""
    if not node.args or node.keywords:
        raise fl.error(node, "pk.wgmma_wait_group(n, acc...) takes a count and accumulator "
                       "arrays")
    require_sm90a(fl, node, "wgmma.wait_group")
    count = fl.expr(node.args[0])
    if not isinstance(count, ConstValue) or count.value not in range(8):
        raise fl.error(node.args[0], "pk.wgmma_wait_group: n must be a compile-time 0..7")
    accs = []
    for arg in node.args[1:]:
        acc = fl.expr(arg)
        if not (isinstance(acc, ArrayValue) and acc.ty.space == "local"):
            raise fl.error(arg, f"pk.wgmma_wait_group: {describe(acc)} is not an accumulator "
                           "array (pk.local_array)")
        accs.append(acc)
    fl.ctx.target.lower_intrinsic("wgmma_wait_group", fl, count.value, accs)
    return ConstValue(None)


def _setmaxnreg(direction):
    name = f"setmaxnreg_{direction}"

    def lower(fl, node):
        (count,), _ = args_of(fl, node, 1, name)
        require_sm90a(fl, node, f"setmaxnreg.{direction}")
        if not isinstance(count, ConstValue) or count.value not in range(24, 257, 8):
            raise fl.error(node.args[0], f"pk.{name}: the register count must be a compile-"
                           "time multiple of 8 in 24..256")
        options = fl.ctx.options
        if not (options.max_threads and options.min_blocks):
            raise fl.error(node, f"pk.{name} needs launch bounds: ptxas cannot tell the "
                           "register count at entry without them and ignores setmaxnreg",
                           hint="declare the kernel @pk.kernel(max_threads=..., "
                           "min_blocks=...); pk.entry_registers(max_threads, min_blocks) is "
                           "what each thread then starts with")
        fl.ctx.target.lower_intrinsic("setmaxnreg", fl, direction, count.value, node)
        return ConstValue(None)
    lower.__doc__ = (f"`pk.{name}(n)`: `setmaxnreg.{direction}.sync.aligned.u32 n` for the "
                     "warpgroup (every thread of it executes it; the CPU target keeps the block's "
                     "register books: module docstring).")
    return intrinsic(name)(lower)


setmaxnreg_inc = _setmaxnreg("inc")
setmaxnreg_dec = _setmaxnreg("dec")
