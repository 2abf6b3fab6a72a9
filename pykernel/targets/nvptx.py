"""The NVPTX target: kernels as `ptx_kernel` functions with global pointers in addrspace(1),
shared memory in addrspace(3), special registers and warp operations as NVVM intrinsics, and
emission through LLVM's NVPTX backend (llvmlite) to PTX text."""
from __future__ import annotations

from llvmlite import ir

from ..errors import KernelSourceError
from ..types import PtrType, ScalarType, TensorMapType, i64
from .archs import ARCH_SPECIFIC, SUPPORTED_ARCHS
from .base import Target
from .nvptx_bulk import NVPTXBulkOps, _asm, ptx_isa
from .nvptx_hopper import HOPPER_INTRINSICS
from .nvptx_intrinsics import INTRINSICS
from .nvptx_memorder import INTRINSICS as MEMORDER_INTRINSICS
from .nvptx_tma import NVPTXTmaOps, mark_tensor_map_param, tensor_map_param_type

I32, I64 = ir.IntType(32), ir.IntType(64)
ADDRSPACE = {"global": 1, "shared": 3, "local": 0, "cluster": 0,   # cluster: generic (mapa)
             "const": 4}
# PTX ISA version per arch: the oldest that supports it (LLVM aborts on a mismatch), so a
# kernel loads on the oldest driver that knows the arch; an instruction needing a newer ISA
# raises the module's .version where it is emitted (ptx_isa, nvptx_intrinsics.needs_ptx).
PTX_VERSION = {75: 63, 80: 70, 86: 71, 89: 78, 90: 78, 100: 86, 120: 87}
SREG = {"thread_idx": "tid", "block_idx": "ctaid", "block_dim": "ntid", "grid_dim": "nctaid"}


class NVPTXTarget(NVPTXBulkOps, NVPTXTmaOps, Target):
    name = "nvptx"
    RESULT_FIELD = "ptx"       # PTX text, loaded by the driver (runtime/cuda.py)
    # intrinsics with a PTX form of their own (nvptx_intrinsics.py, nvptx_hopper.py)
    INTRINSICS = {**INTRINSICS, **HOPPER_INTRINSICS, **MEMORDER_INTRINSICS}
    triple = "nvptx64-nvidia-cuda"
    datalayout = "e-i64:64-i128:128-v16:16-v32:32-n16:32:64"

    def __init__(self, arch: str = "sm_90"):
        if arch not in SUPPORTED_ARCHS + ARCH_SPECIFIC:
            raise ValueError(f"unsupported arch {arch!r}; supported: "
                             f"{', '.join(SUPPORTED_ARCHS + ARCH_SPECIFIC)}")
        self.arch, self.sm = arch, int(arch[3:].rstrip("a"))
        self.arch_specific = arch.endswith("a")     # sm_90a: wgmma, setmaxnreg
        if self.arch_specific:
            self.min_ptx = 80     # the oldest PTX ISA that knows sm_90a

    def half_native(self, ty: ScalarType, op: str) -> bool:
        """Whether f16/bf16 `op` ("add" "sub" "mul" "fma" "min" "max" "cmp") is emitted in the
        half type. LLVM picks the instruction per arch (`add.rn.f16` sm_53+; `add.rn.bf16`
        sm_90+, `fma.rn.bf16 a, 1.0, b` on sm_80; f32 and one rounding before), all exact,
        except bf16 fma before sm_80, which LLVM computes as an f32 fma rounded again."""
        return not (ty.name == "bf16" and op == "fma" and self.sm < 80)

    # --- function shape ------------------------------------------------------------------------
    def pointer_type(self, ty: PtrType) -> ir.Type:
        return ir.PointerType(ty.elem.storage, addrspace=ADDRSPACE[ty.space])

    def create_kernel(self, module, name, params, options):
        """params: list of (name, PtrType | ScalarType). Returns (function, [ir values])."""
        types = [self.pointer_type(t) if isinstance(t, PtrType) else
                 tensor_map_param_type() if isinstance(t, TensorMapType) else t.storage
                 for _, t in params]
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), types), name)
        fn.calling_convention = "ptx_kernel"
        for index, (arg, (pname, t)) in enumerate(zip(fn.args, params)):
            arg.name = pname
            if isinstance(t, PtrType) and t.readonly:
                arg.add_attribute("noalias")
            if isinstance(t, TensorMapType):
                mark_tensor_map_param(module, fn, arg, index)
        values = [a if not (isinstance(t, ScalarType) and t.kind == "bool")
                  else None for a, (_, t) in zip(fn.args, params)]
        self._launch_bounds(module, fn, options)
        return fn, values, list(fn.args)

    @staticmethod
    def _launch_bounds(module, fn, options):
        """.maxntid / .minnctapersm: ptxas budgets registers so min_blocks blocks of
        max_threads threads fit on one SM (CUDA's __launch_bounds__)."""
        bounds = [("maxntidx", options.max_threads), ("minctasm", options.min_blocks)]
        for key, value in bounds:
            if value:
                module.add_named_metadata("nvvm.annotations",
                                          [fn, ir.MetaDataString(module, key),
                                           ir.Constant(I32, value)])

    def begin_body(self, ctx):
        return ctx.append_block("body")

    def finish_kernel(self, ctx):
        ir.IRBuilder(ctx.exit_block).ret_void()
        ir.IRBuilder(ctx.entry).branch(ctx.target_data["body"])
        if ctx.options.pdl and self.sm >= 90:
            self._pdl_prologue(ctx)

    def _pdl_prologue(self, ctx):
        """Programmatic dependent launch. Wait for the previous kernel's results at entry
        unless the body placed `pk.grid_dependency_wait()` itself; let the next kernel start
        launching once this one's blocks are done with their work (before the exit's memory
        flush) unless the body placed `pk.launch_dependents()` itself. Triggering at entry
        was measured faster for one-wave kernels but slower for multi-wave ones (waiting
        blocks take the slots of the last wave): benchmarks/RESULTS.md."""
        ctx.uses.add("pdl")
        body = ctx.target_data["body"]
        if "grid_dependency_wait" not in ctx.uses:
            builder = ir.IRBuilder(body)
            builder.position_at_start(body)
            _asm_statement(builder, "griddepcontrol.wait;")
        if "launch_dependents" not in ctx.uses:
            builder = ir.IRBuilder(ctx.exit_block)
            builder.position_before(ctx.exit_block.instructions[-1])
            _asm_statement(builder, "griddepcontrol.launch_dependents;")

    def grid_dependency_wait(self, ctx):
        if self.sm >= 90:
            _asm_statement(ctx.builder, "griddepcontrol.wait;")

    def prefetch_l2(self, ctx, ptr):
        if ptr.type.addrspace != ADDRSPACE["global"]:
            return   # shared/local memory: nothing to prefetch
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [I64]), "prefetch.global.L2 [$0];",
                           "l", side_effect=True)
        ctx.builder.call(asm, [ctx.builder.ptrtoint(ptr, I64)])

    def cp_async(self, ctx, dst, src, size, src_size, site):
        """size bytes global -> shared without registers: `cp.async.cg` (L2 only, as a stream
        of weights wants) for 16 bytes, `.ca` for 4 / 8; the shared address as 32 bits, the
        global one as 64; src_size: bytes read (the rest zero-filled)."""
        self.check_address(ctx, dst.ptr, dst.elem, dst.origin, site, size)
        if src_size is None:
            self.check_address(ctx, src.ptr, src.elem, src.origin, site, size)
        b = ctx.builder
        level = "cg" if size == 16 else "ca"
        args = [b.ptrtoint(dst.ptr, I32), b.ptrtoint(src.ptr, I64)]
        text = f"cp.async.{level}.shared.global [$0], [$1], {size}"
        if src_size is not None:
            args.append(src_size.ir)
            text += ", $2"
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [a.type for a in args]), text + ";",
                           ",".join(["r", "l", "r"][:len(args)]) + ",~{memory}",
                           side_effect=True)
        b.call(asm, args)

    def cp_async_commit(self, ctx):
        _asm_statement(ctx.builder, "cp.async.commit_group;")

    def cp_async_wait(self, ctx, n: int):
        _asm_statement(ctx.builder, f"cp.async.wait_group {n};")

    def syncwarp(self, ctx, site):
        _asm_statement(ctx.builder, "bar.warp.sync -1;")

    def launch_dependents(self, ctx):
        if self.sm >= 90:
            _asm_statement(ctx.builder, "griddepcontrol.launch_dependents;")

    # --- registers and synchronisation -------------------------------------------------------
    def special_register(self, ctx, which, axis):
        name = "llvm.nvvm.read.ptx.sreg." + ("laneid" if which == "lane_id"
                                              else f"{SREG[which]}.{axis}")
        return ctx.builder.call(ctx.intrinsic_decl(name, ret=I32, args=()), [])

    def barrier(self, ctx, site):
        ctx.builder.call(ctx.intrinsic_decl("llvm.nvvm.barrier0", ret=ir.VoidType(), args=()),
                         [])

    # --- thread-block clusters (intrinsics/cluster.py) -------------------------------------------
    @ptx_isa(80)
    def cluster_register(self, ctx, which):
        reg = "%cluster_ctarank" if which == "rank" else "%cluster_nctarank"
        return _asm(ctx.builder, f"mov.u32 $0, {reg};", "=r", [], ret=I32)

    @ptx_isa(80)   # .release / .acquire on barrier.cluster
    def cluster_sync(self, ctx, site):
        _asm(ctx.builder, "barrier.cluster.arrive.release.aligned; "
             "barrier.cluster.wait.acquire.aligned;", "", [])

    @ptx_isa(80)
    def cluster_map(self, ctx, ptr, origin, rank, site):
        """The generic address of a shared pointer, mapped into block `rank` by mapa."""
        b = ctx.builder

        def remote(p):
            generic = b.addrspacecast(p, ir.PointerType(p.type.pointee, addrspace=0))
            mapped = _asm(b, "mapa.u64 $0, $1, $2;", "=l,l,r",
                          [b.ptrtoint(generic, I64), rank], ret=I64)
            return b.inttoptr(mapped, generic.type)
        if not ctx.options.bounds_check:
            return remote(ptr), None
        if isinstance(origin, tuple) and origin[0] in ("array", "range", "bounds"):
            origin = (origin[0], remote(origin[1])) + tuple(origin[2:])
        return remote(ptr), origin

    def fence(self, ctx):
        ctx.builder.call(ctx.intrinsic_decl("llvm.nvvm.membar.gl", ret=ir.VoidType(),
                                            args=()), [])

    def shuffle(self, ctx, kind, word, lane, mask, site):
        # clamp operand: 31 for bfly/down/idx (c = 0x1f), 0 for up (segment mask 0).
        clamp = ir.Constant(I32, 0 if kind == "up" else 31)
        fn = ctx.intrinsic_decl(f"llvm.nvvm.shfl.sync.{kind}.i32", ret=I32,
                                args=(I32, I32, I32, I32))
        return ctx.builder.call(fn, [mask, word, lane, clamp])

    def vote(self, ctx, kind, pred, mask, site):
        name = {"ballot": "llvm.nvvm.vote.ballot.sync", "any_sync": "llvm.nvvm.vote.any.sync",
                "all_sync": "llvm.nvvm.vote.all.sync"}[kind]
        ret = I32 if kind == "ballot" else ir.IntType(1)
        fn = ctx.intrinsic_decl(name, ret=ret, args=(I32, ir.IntType(1)))
        return ctx.builder.call(fn, [mask, pred])

    # --- memory --------------------------------------------------------------------------------
    def shared_array(self, ctx, aty, align=16):
        gv = ir.GlobalVariable(ctx.module, ir.ArrayType(aty.elem.storage, aty.count),
                               ctx.module.get_unique_name("shared"), addrspace=3)
        gv.align = align
        gv.linkage = "internal"
        gv.initializer = ir.Constant(gv.value_type, ir.Undefined)
        ctx.shared_bytes = -(-ctx.shared_bytes // align) * align + aty.count * aty.elem.nbytes
        zero = ir.Constant(I32, 0)
        return ctx.builder.gep(gv, [zero, zero])

    @staticmethod
    def constant_table(ctx, init: ir.Constant) -> ir.GlobalVariable:
        """A pk.const_array in the `.const` state space (addrspace 4): `ld.const`."""
        gv = ir.GlobalVariable(ctx.module, init.type, ctx.module.get_unique_name("const_table"),
                               addrspace=ADDRSPACE["const"])
        gv.initializer, gv.global_constant, gv.linkage, gv.align = init, True, "internal", 16
        return gv

    def dynamic_shared(self, ctx, elem):
        gv = ctx.module.globals.get("__pk_dynamic_shared")
        if gv is None:
            gv = ir.GlobalVariable(ctx.module, ir.ArrayType(ir.IntType(8), 0),
                                   "__pk_dynamic_shared", addrspace=3)
            gv.align = 16
            gv.linkage = "external"
        ptr = ctx.builder.bitcast(gv, ir.PointerType(elem.storage, addrspace=3))
        return ptr, None

    def check_address(self, ctx, ptr, elem, origin, site, nbytes=None):
        """With bounds_check: trap (after printing kernel, file:line and the offset) on an
        access outside the pointer argument or shared/local array it derives from."""
        if not ctx.options.bounds_check or origin is None:
            return ptr
        b = ctx.builder
        extent = self._extent(ctx, origin)
        if extent is None:
            return ptr
        base, size = extent
        offset = b.sub(b.ptrtoint(ptr, I64), b.ptrtoint(base, I64))
        access = (nbytes if isinstance(nbytes, ir.Value)   # a runtime size (bulk copies)
                  else ir.Constant(I64, nbytes or elem.nbytes))
        end = b.add(offset, access)
        bad = b.or_(b.icmp_signed("<", offset, ir.Constant(I64, 0)),
                    b.icmp_signed(">", end, size))
        with b.if_then(bad, likely=False):
            self._report_oob(ctx, site, offset, size)
        return ptr

    def _extent(self, ctx, origin):
        if origin[0] == "param":
            k = origin[1]
            names = [p[0] for p in ctx.target_data["params"]]
            hidden = "__nbytes_" + names[k]
            if hidden not in names:
                return None
            args = ctx.function.args
            return args[k], args[names.index(hidden)]
        if origin[0] == "array" and isinstance(origin[2], int):
            return origin[1], ir.Constant(I64, origin[2])
        if origin[0] == "bounds":             # chosen at run time (lower/ptr_bounds.py)
            return origin[1], origin[2]
        return None

    def tracks_pointer_bounds(self, ctx):
        return ctx.options.bounds_check

    def pointer_bounds(self, ctx, origin):
        extent = self._extent(ctx, origin)
        if extent is None:
            return None
        b, (base, size) = ctx.builder, extent
        if size.type != I64:
            size = b.zext(size, I64)
        return b.inttoptr(b.ptrtoint(base, I64), ir.IntType(8).as_pointer()), size

    def check_index(self, ctx, index, extent, make_site):
        """With bounds_check: trap (after printing kernel, file:line, index and extent) on an
        n-d array index (i64) outside [0, extent)."""
        if not ctx.options.bounds_check:
            return index
        b = ctx.builder
        with b.if_then(b.icmp_unsigned(">=", index, extent), likely=False):
            where = ctx.sites[make_site()]
            self._vprintf(ctx, f"pykernel: kernel '{ctx.kernel_name}': {where.kind} at "
                          f"{where.file}:{where.line}:{where.col + 1} (index %lld, extent "
                          f"%lld)\n", [index, extent])
            b.call(ctx.intrinsic_decl("llvm.trap", ret=ir.VoidType(), args=()), [])
        return index

    def _report_oob(self, ctx, site, offset, size):
        where = ctx.sites[site]
        self._vprintf(ctx, f"pykernel: kernel '{ctx.kernel_name}': {where.kind} at "
                      f"{where.file}:{where.line}:{where.col + 1} (byte offset %lld, size "
                      f"%lld)\n", [offset, size])
        ctx.builder.call(ctx.intrinsic_decl("llvm.trap", ret=ir.VoidType(), args=()), [])

    def device_print(self, ctx, fmt: str, args: list) -> None:
        """print() in a kernel (lower/printing.py): args are i64 / f64 / string IR values."""
        self._vprintf(ctx, fmt, args)

    @staticmethod
    def print_string(ctx, text: str) -> ir.Value:
        """A constant string in global memory, as the generic i8* vprintf takes."""
        return ctx.builder.addrspacecast(ctx.constant_string(text, ADDRSPACE["global"]),
                                         ir.IntType(8).as_pointer())

    def _vprintf(self, ctx, fmt: str, args: list) -> None:
        """CUDA's device printf: the format and a buffer holding the arguments at their natural
        alignment (a struct of their types)."""
        b, m = ctx.builder, ctx.module
        i8p = ir.IntType(8).as_pointer()
        vprintf = m.globals.get("vprintf") or ir.Function(
            m, ir.FunctionType(I32, [i8p, i8p]), "vprintf")
        buf = ir.Constant(i8p, None)
        if args:
            argbuf = ctx.alloca(ir.LiteralStructType([a.type for a in args]), "print.args")
            for k, a in enumerate(args):
                b.store(a, b.gep(argbuf, [ir.Constant(I32, 0), ir.Constant(I32, k)]))
            buf = b.bitcast(argbuf, i8p)
        b.call(vprintf, [self.print_string(ctx, fmt), buf])

    def load(self, ctx, ptr, elem, readonly):
        inst = ctx.builder.load(ptr, align=elem.nbytes)
        if readonly:   # read-only global data: ld.global.nc
            inst.set_metadata("invariant.load", ctx.module.add_metadata([]))
        return inst

    def store(self, ctx, ptr, raw, elem):
        ctx.builder.store(raw, ptr, align=elem.nbytes)

    def load_vector(self, ctx, addr, vec_ty, site, l2_fetch=0):
        self.check_address(ctx, addr.ptr, addr.elem, addr.origin, site,
                           vec_ty.count * addr.elem.nbytes)
        if l2_fetch and addr.ptr.type.addrspace == ADDRSPACE["global"] and self.sm >= 80:
            # a hint: before sm_80 (which lacks .L2::256B) and off global memory, a plain load
            return self._load_l2_fetch(ctx, addr, vec_ty, l2_fetch)
        vptr = ctx.builder.bitcast(addr.ptr, ir.PointerType(vec_ty, addrspace=addr.ptr.type
                                                            .addrspace))
        inst = ctx.builder.load(vptr, align=vec_ty.count * addr.elem.nbytes)
        if addr.readonly:
            inst.set_metadata("invariant.load", ctx.module.add_metadata([]))
        return inst

    @ptx_isa(74)   # the .L2::<size>B prefetch qualifier
    def _load_l2_fetch(self, ctx, addr, vec_ty, l2_fetch):
        """`ld.global[.nc].L2::<size>B.v<w>.b32`: LLVM's loads have no prefetch-size
        qualifier, so the hinted load is inline PTX of 32-bit words, bitcast back."""
        b = ctx.builder
        words = vec_ty.count * addr.elem.nbytes // 4
        nc = ".nc" if addr.readonly else ""
        vec = f".v{words}" if words > 1 else ""
        outs = ", ".join(f"${k}" for k in range(words))
        outs = f"{{{outs}}}" if words > 1 else outs
        template = f"ld.global{nc}.L2::{l2_fetch}B{vec}.b32 {outs}, [${words}];"
        ret = I32 if words == 1 else ir.LiteralStructType([I32] * words)
        # a writable pointer's load must stay ordered with the stores around it
        clobber = [] if addr.readonly else ["~{memory}"]
        asm = ir.InlineAsm(ir.FunctionType(ret, [I64]), template,
                           ",".join(["=r"] * words + ["l"] + clobber),
                           side_effect=not addr.readonly)
        res = b.call(asm, [b.ptrtoint(addr.ptr, I64)])
        word_vec = ir.VectorType(I32, words)
        packed = ir.Constant(word_vec, ir.Undefined)
        for k in range(words):
            packed = b.insert_element(packed, res if words == 1 else b.extract_value(res, k),
                                      ir.Constant(I32, k))
        return b.bitcast(packed, vec_ty)

    def store_vector(self, ctx, addr, vec, site):
        self.check_address(ctx, addr.ptr, addr.elem, addr.origin, site,
                           vec.type.count * addr.elem.nbytes)
        vptr = ctx.builder.bitcast(addr.ptr, ir.PointerType(vec.type, addrspace=addr.ptr.type
                                                            .addrspace))
        ctx.builder.store(vec, vptr, align=vec.type.count * addr.elem.nbytes)

    def atomic(self, ctx, op, ptr, vals, elem):
        b = ctx.builder
        if op == "cas":
            pair = b.cmpxchg(ptr, vals[0], vals[1], "monotonic", "monotonic")
            return b.extract_value(pair, 0)
        rmw = {"add": "fadd" if elem.is_float else "add", "exch": "xchg",
               "max": "fmax" if elem.is_float else ("max" if elem.is_signed else "umax"),
               "min": "fmin" if elem.is_float else ("min" if elem.is_signed else "umin")}[op]
        return b.atomic_rmw(rmw, ptr, vals[0], "monotonic")

    def assert_fail(self, ctx, site):
        ctx.builder.call(ctx.intrinsic_decl("llvm.trap", ret=ir.VoidType(), args=()), [])
        ctx.builder.unreachable()

    # --- compile decisions and emission --------------------------------------------------------
    def hidden_params(self, params, options) -> list:
        """With bounds_check: the byte size of each plain pointer argument (the launcher
        appends them), so generated code can check every access. (Array parameters carry
        their shape instead: each index is checked against it.)"""
        if not options.bounds_check:
            return []
        return [(f"__nbytes_{n}", i64) for n, t in params if type(t) is PtrType]

    def debug_info(self, module, fn, fast, options):
        """With lineinfo: `.file` / `.loc` line tables, for profilers to map PTX to Python."""
        if not options.lineinfo:
            return None
        from ..lower.debuginfo import DebugInfo
        return DebugInfo(module, fn, fast)

    def emit(self, llvm_module, options, ctx=None) -> str:
        import llvmlite.binding as llvm
        _init_nvptx()
        target = llvm.Target.from_triple(self.triple)
        ptx = max(PTX_VERSION[self.sm], self.min_ptx)
        tm = target.create_target_machine(cpu=self.arch, features=f"+ptx{ptx}",
                                          opt=options.opt_level, codemodel="default")
        return tm.emit_assembly(llvm_module)


_NVPTX_READY = False


def _init_nvptx():
    global _NVPTX_READY
    if not _NVPTX_READY:
        import llvmlite.binding as llvm
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
        _NVPTX_READY = True


__all__ = ["NVPTXTarget", "KernelSourceError"]


def _asm_statement(builder, text: str):
    """A side-effecting PTX statement that also orders memory (a compiler barrier)."""
    asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}",
                       side_effect=True)
    builder.call(asm, [])
