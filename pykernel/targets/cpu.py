"""The CPU target: the same kernels as native host code (LLVM's host backend via llvmlite).

Each GPU thread is one call of a per-thread function. Kernels that synchronise (syncthreads,
shuffles, votes, mma) compile that function as an LLVM coroutine (switch-resumed, split by
LLVM's CoroSplit pass): a barrier is a suspension, and a scheduler in the entry point resumes
every thread of the block until all reach the same barrier, so values live across barriers
stay in each thread's coroutine frame. Kernels without synchronisation run as plain loops.
Every memory access is bounds-checked against the launch's array extents."""
from __future__ import annotations

import re

from llvmlite import ir

from ..types import PtrType, TensorMapType
from . import cpu_abi as abi
from .base import Target
from .cpu_bulk import CPUBulkOps
from .cpu_cluster import CPUClusterOps
from .cpu_hopper import HOPPER_INTRINSICS
from .cpu_intrinsics import INTRINSICS
from .cpu_memorder import INTRINSICS as MEMORDER_INTRINSICS
from .cpu_ops import CPUOps
from .cpu_regs import finish_books
from .cpu_regs import setmaxnreg as _setmaxnreg
from .cpu_coroutines import coro_decls, patch_coroutine_text
from .cpu_runner import build_entry
from .cpu_tma import CPUTmaOps

I8P = ir.IntType(8).as_pointer()
I64, I32, I1 = ir.IntType(64), ir.IntType(32), ir.IntType(1)


class CPUTarget(CPUOps, CPUBulkOps, CPUClusterOps, CPUTmaOps, Target):
    name = "cpu"
    RESULT_FIELD = "cpu"       # a CPUProgram: the JIT-compiled entry point
    # the warp-collective intrinsics, emulated (cpu_intrinsics.py, cpu_hopper.py)
    INTRINSICS = {**INTRINSICS, **HOPPER_INTRINSICS, **MEMORDER_INTRINSICS,
                  "setmaxnreg": _setmaxnreg}
    sm = None          # no arch gating: every instruction is emulated

    def __init__(self):
        import llvmlite.binding as llvm
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        self.triple = llvm.get_process_triple()
        self._tm = self._target_machine()
        self.datalayout = str(self._tm.target_data)

    def _target_machine(self):
        import llvmlite.binding as llvm
        return llvm.Target.from_triple(self.triple).create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
            opt=2, jit=True)

    def pointer_type(self, ty: PtrType) -> ir.Type:
        return ir.PointerType(ty.elem.storage)

    @staticmethod
    def half_native(ty, op: str) -> bool:
        """f16/bf16 arithmetic is emulated here (ops.py, same rounding): LLVM's own x86
        lowering of `bfloat` needs runtime-library calls that the JIT does not provide."""
        return False

    # --- function shape ------------------------------------------------------------------------
    def create_kernel(self, module, name, params, options):
        fnty = ir.FunctionType(I8P, [I8P, I64.as_pointer()] + [I32] * 7)
        fn = ir.Function(module, fnty, name + ".thread")
        fn.linkage = "internal"
        for arg, n in zip(fn.args, ["args", "ctx", "tx", "ty", "tz", "bx", "by", "bz", "tlin"]):
            arg.name = n
        return fn, None, _LazyParams(params)

    def begin_body(self, ctx):
        fn = ctx.function
        ctx.target_data.update(args=fn.args[0], ctx=fn.args[1], tid=fn.args[2:5],
                               bid=fn.args[5:8], tlin=fn.args[8])
        b = ir.IRBuilder(ctx.entry)
        loaded, offset = [], 0
        for name, ty in ctx.target_data.get("params", ()):
            size = 8 if isinstance(ty, PtrType) else ty.nbytes
            offset += (-offset) % getattr(ty, "align", size)
            raw = b.gep(fn.args[0], [ir.Constant(I64, offset)])
            if isinstance(ty, TensorMapType):     # its record stays in the buffer
                loaded.append(raw)
            elif isinstance(ty, PtrType):
                addr = b.load(b.bitcast(raw, I64.as_pointer()))
                loaded.append(b.inttoptr(addr, self.pointer_type(ty), name=name))
            else:
                loaded.append(b.load(b.bitcast(raw, ty.storage.as_pointer()), name=name))
            offset += size
        ctx.target_data["param_values"] = loaded
        return ctx.append_block("body")

    def ctx_slot(self, ctx, slot: int, builder=None):
        b = builder or ctx.builder
        return b.load(b.gep(ctx.target_data["ctx"], [ir.Constant(I64, slot)]))

    def finish_kernel(self, ctx):
        ctx.target_data["reg_pool"] = finish_books(ctx, ctx.options)
        if ctx.target_data.get("coroutine"):
            self._finish_coroutine(ctx)
        else:
            ir.IRBuilder(ctx.exit_block).ret(ir.Constant(I8P, None))
            ir.IRBuilder(ctx.entry).branch(ctx.target_data["body"])
        build_entry(ctx, self)

    # --- coroutines ----------------------------------------------------------------------------
    def _coro_blocks(self, ctx):
        td = ctx.target_data
        if not td.get("coroutine"):
            td["coroutine"] = True
            td["suspend_ret"] = ctx.append_block("coro.suspend")
            td["cleanup"] = ctx.append_block("coro.cleanup")
        return td["suspend_ret"], td["cleanup"]

    def suspend(self, ctx, kind: int, site: int):
        """Record why this thread stops, suspend, and continue here when resumed."""
        suspend_ret, cleanup = self._coro_blocks(ctx)
        b = ctx.builder
        self._set_state(ctx, b, (kind << 24) | site)
        s = b.call(coro_decls(ctx.module)["suspend"], [ir.Constant(I1, 0)])
        resume = ctx.append_block("resume")
        sw = b.switch(s, suspend_ret)
        sw.add_case(ir.Constant(ir.IntType(8), 0), resume)
        sw.add_case(ir.Constant(ir.IntType(8), 1), cleanup)
        b.position_at_end(resume)

    def _set_state(self, ctx, b, value):
        state = b.inttoptr(self.ctx_slot(ctx, abi.STATE_PTR, b), I32.as_pointer())
        b.store(ir.Constant(I32, value), b.gep(state, [ctx.target_data["tlin"]]))

    def _finish_coroutine(self, ctx):
        d = coro_decls(ctx.module)
        td = ctx.target_data
        b = ir.IRBuilder(ctx.entry)
        cid = b.call(d["id"], [])
        mem = b.call(d["malloc"], [b.call(d["size"], [])])
        hdl = b.call(d["begin"], [cid, mem])
        s = b.call(d["suspend"], [ir.Constant(I1, 0)])      # start suspended
        sw = b.switch(s, td["suspend_ret"])
        sw.add_case(ir.Constant(ir.IntType(8), 0), td["body"])
        sw.add_case(ir.Constant(ir.IntType(8), 1), td["cleanup"])
        b = ir.IRBuilder(td["cleanup"])
        b.call(d["free"], [b.call(d["coro_free"], [cid, hdl])])
        b.branch(td["suspend_ret"])
        b = ir.IRBuilder(td["suspend_ret"])
        b.call(d["end"], [hdl, ir.Constant(I1, 0)])
        b.ret(hdl)
        if td.get("warp_counter") is not None:
            self.mark_running(ctx)
        b = ir.IRBuilder(ctx.exit_block)
        self.clear_warp_flag(ctx, b)
        self._set_state(ctx, b, abi.FINISHED << 24)
        s = b.call(d["suspend"], [ir.Constant(I1, 1)])       # final suspension
        sw = b.switch(s, td["suspend_ret"])
        sw.add_case(ir.Constant(ir.IntType(8), 0), td["cleanup"])
        sw.add_case(ir.Constant(ir.IntType(8), 1), td["cleanup"])

    # --- emission ------------------------------------------------------------------------------
    def emit(self, ref, options, ctx):
        import llvmlite.binding as llvm
        if ctx.target_data.get("coroutine"):
            text = patch_coroutine_text(_mark_presplit(str(ctx.module), ctx.function.name))
            ref = llvm.parse_assembly(text)
            ref.verify()
        self.optimize(ref)
        # native object code: loaded here, and kept for the disk cache (cache.py), which
        # spares later processes the optimization and code generation (most of a compile)
        return self.load_object(self._tm.emit_object(ref), ctx.target_data["entry_name"],
                                bool(ctx.target_data.get("coroutine")), ctx.shared_bytes)

    def optimize(self, ref) -> None:
        """The quick pipeline: SROA, InstCombine and SimplifyCFG, then LLVM's O0 pipeline
        (which still lowers coroutines: CoroSplit moves values live across barriers into the
        frame), then the same three passes on the split functions. Not LLVM's O2: compiling is
        nearly all of a fresh CI run, and O2's GVN, LICM, CorrelatedValuePropagation and
        JumpThreading grow faster than linearly on the large coroutines of the tensor-core and
        batched GEMV kernels (17 s for one batch-5 GEMV; 3 s this way). No pass here changes a
        float result: the IR carries no fast-math flags except `contract` under fp_contract
        (benchmarks/RESULTS.md, "Cold compiles: where the time went", has the figures)."""
        import llvmlite.binding as llvm
        for stage in (_CLEANUP, None, _CLEANUP):
            builder = llvm.create_pass_builder(self._tm,
                                               llvm.create_pipeline_tuning_options(speed_level=0))
            if stage is None:
                builder.getModulePassManager().run(ref, builder)
                continue
            passes = llvm.create_new_module_pass_manager()
            for name in stage:
                getattr(passes, f"add_{name}_pass")()
            passes.run(ref, builder)

    def load_object(self, obj: bytes, entry: str, coroutine: bool, shared_bytes: int):
        import llvmlite.binding as llvm
        # the engine owns the target machine it is given and frees it with itself: one each,
        # never the shared self._tm (a freed one crashed the next load from the disk cache)
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self._target_machine())
        engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        engine.finalize_object()
        address = engine.get_function_address(entry)
        if not address:
            raise RuntimeError(f"pykernel: entry {entry!r} missing from CPU object code")
        return CPUProgram(engine, address, coroutine, shared_bytes, obj)

    @staticmethod
    def host_identity() -> str:
        """What the object code depends on besides the kernel: triple, CPU and its features."""
        import llvmlite.binding as llvm
        return (f"{llvm.get_process_triple()}|{llvm.get_host_cpu_name()}|"
                f"{llvm.get_host_cpu_features().flatten()}")


# the cleanup before and after coroutine lowering: allocas to registers, local folding, and the
# branches the lowering's bounds checks and compile-time `if`s leave behind
_CLEANUP = ("sroa", "instruction_combine", "simplify_cfg")


def _mark_presplit(text: str, fname: str) -> str:
    pattern = re.compile(r'(define internal (?:i8\*|ptr) @"' + re.escape(fname) + r'"\([^)]*\))')
    return pattern.sub(r"\1 presplitcoroutine", text, count=1)


class _LazyParams(list):
    """The CPU target loads parameters from the args buffer in begin_body."""

    def __init__(self, params):
        super().__init__()
        self.params = params


class CPUProgram:
    def __init__(self, engine, address, coroutine, shared_bytes, obj: bytes = b""):
        self.engine, self.address = engine, address   # the engine keeps the code mapped
        self.coroutine, self.shared_bytes = coroutine, shared_bytes
        self.object = obj
