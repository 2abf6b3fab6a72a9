"""The compile pipeline, one line per stage:

    parse(fn)                          -> FunctionAST       (frontend/parse.py)
    lower(FunctionAST, spec, target)   -> llvmlite ir.Module (lower/, types checked as it lowers)
    verify(ir.Module)                  -> llvm ModuleRef     (llvmlite.binding)
    target.emit(ModuleRef, options, ctx) -> PTX text | host machine code (targets/)

`compile_kernel` adds the two caches (memory, then disk for PTX)."""
from __future__ import annotations

import ast

import numpy as np
from llvmlite import ir

from . import cache
from .compiled import CompiledKernel, ParamABI
from .errors import KernelSourceError
from .frontend.parse import FunctionAST, parse
from .lower.codegen import FunctionLowering
from .lower.context import KernelContext, Options
from .lower.ndarray import bind_array_param, is_array_extent
from .lower.values import ConstValue, PtrValue, TensorMapValue, TypeValue, Value
from .signature import concrete_params
from .targets import get_target
from .types import ArrayPtrType, PtrType, ScalarType, TensorMapType


def lower(fast: FunctionAST, params, spec: dict, target, options: Options, entry: str):
    """Stage 2: the kernel body as LLVM IR in a module for `target`."""
    module = ir.Module(name=fast.name)
    module.triple, module.data_layout = target.triple, target.datalayout
    fn, _, raw_args = target.create_kernel(module, entry, params, options)
    ctx = KernelContext(module, fn, target, options, fast.name)
    ctx.entry = fn.append_basic_block("entry")
    ctx.builder = ir.IRBuilder(ctx.entry)
    ctx.target_data["params"] = params
    body = target.begin_body(ctx)
    raw_args = ctx.target_data.get("param_values", raw_args)
    ctx.target_data["body"] = body
    ctx.exit_block = ctx.append_block("exit")
    ctx.builder.position_at_end(body)
    ctx._debug = target.debug_info(module, fn, fast, options)
    bindings = dict(spec_bindings(spec))
    for k, ((pname, pty), raw) in enumerate(zip(params, raw_args)):
        if isinstance(pty, ArrayPtrType):    # its shape/stride parameters follow it
            bindings[pname] = bind_array_param(params, raw_args, k)
        elif isinstance(pty, PtrType):
            bindings[pname] = PtrValue(pty, raw, ("param", k))
        elif isinstance(pty, TensorMapType):  # the parameter's address: read-only, by value
            bindings[pname] = TensorMapValue(pty, raw, pname)
        elif not is_array_extent(params, k):
            bindings[pname] = Value(pty, raw if pty.kind != "bool" else
                                    ctx.builder.icmp_unsigned("!=", raw,
                                                              ir.Constant(raw.type, 0)))
    fl = FunctionLowering(fast, ctx, {})
    for name, val in bindings.items():     # scalars become mutable variables
        if isinstance(val, (Value, PtrValue)):
            fl.assign_name(name, val, fast.tree)
        else:
            fl.vars[name] = val
    fl.body(fast.tree.body)
    if not ctx.builder.block.is_terminated:
        ctx.builder.branch(ctx.exit_block)
    target.finish_kernel(ctx)
    if ctx._debug is not None:
        ctx._debug.finalize()
    return module, ctx


def spec_bindings(spec: dict):
    for name, value in spec.items():
        yield name, TypeValue(value) if isinstance(value, ScalarType) else ConstValue(value)


def verify(module: ir.Module, text: str | None = None):
    """The module parsed by LLVM and verified; `text`: str(module) if already made (building it
    is a large part of a compile)."""
    import llvmlite.binding as llvm
    try:
        ref = llvm.parse_assembly(text if text is not None else str(module))
        ref.verify()
    except RuntimeError as exc:  # a compiler bug, not a user error: say so plainly
        raise RuntimeError(f"pykernel produced invalid LLVM IR for '{module.name}' (a pykernel "
                           f"bug; please report it): {exc}") from None
    return ref


def param_abi(params) -> list[ParamABI]:
    out = []
    for name, ty in params:
        if isinstance(ty, ArrayPtrType):
            out.append(ParamABI(name, "array", ty.elem.np_dtype, 8, 8, ty.readonly, repr(ty),
                                rank=ty.rank))
        elif isinstance(ty, PtrType):
            out.append(ParamABI(name, "ptr", ty.elem.np_dtype, 8, 8, ty.readonly, repr(ty)))
        elif isinstance(ty, TensorMapType):
            out.append(ParamABI(name, "tensormap", np.dtype(np.uint8), ty.nbytes, ty.align,
                                True, repr(ty)))
        else:
            out.append(ParamABI(name, "scalar", ty.np_dtype, ty.nbytes, ty.nbytes, False,
                                ty.name))
    return out


def entry_name(name: str, spec: dict) -> str:
    if not spec:
        return name
    parts = [f"{k}_{getattr(v, 'name', v)}" for k, v in sorted(spec.items())]
    safe = "".join(c if c.isalnum() else "_" for c in "__".join(parts))
    return f"{name}__{safe}"


def compile_kernel(kernel, arch: str, spec: dict, options: Options,
                   key: str | None = None, fresh: bool = False) -> CompiledKernel:
    """fresh=True skips the caches (the disk keeps no LLVM IR; Kernel.llvm_ir needs it)."""
    key = key or cache.kernel_key(kernel, arch, spec, options)
    hit = None if fresh else cache.lookup(key, arch)
    if hit is not None:
        return hit
    fast = parse(kernel.fn)                                    # stage 1
    target = get_target(arch)
    params = concrete_params(kernel.params, spec, kernel.fn)
    params = params + target.hidden_params(params, options)
    entry = entry_name(fast.name, spec)
    try:
        module, ctx = lower(fast, params, spec, target, options, entry)   # stage 2
    except KernelSourceError as err:
        # The one choke point: users see the compiler-style message, not our frames.
        raise err.with_traceback(None) from None
    text = str(module)
    ref = verify(module, text)                                 # stage 3
    compiled = CompiledKernel(
        name=fast.name, entry=entry, target=target.name, arch=arch, params=param_abi(params),
        shared_bytes=ctx.shared_bytes, cache_key=key,
        hidden_extents=sum(1 for n, _ in params if n.startswith("__nbytes_")), llvm_ir=text,
        sites=ctx.sites,
        uses=frozenset(ctx.uses), min_arch=f"sm_{ctx.min_arch[0]}", source_hash=fast.source_hash)
    setattr(compiled, target.RESULT_FIELD, target.emit(ref, options, ctx))   # stage 4
    cache.store(key, arch, compiled)
    return compiled


__all__ = ["CompiledKernel", "ParamABI", "compile_kernel", "lower", "parse", "ast"]
