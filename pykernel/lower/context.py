"""Per-kernel lowering state shared by the kernel body and every inlined device function:
the LLVM function and builder, the target, options, error sites and debug locations."""
from __future__ import annotations

from dataclasses import dataclass, field

from llvmlite import ir

from ..compiled import Site
from ..types import PtrType


@dataclass(frozen=True)
class Options:
    """Compile options: part of the cache key."""
    debug: bool = False          # compile `assert` statements in
    bounds_check: bool = False   # check Ptr / pk.Array indexing on the GPU (always on for CPU)
    lineinfo: bool = True        # .loc directives so profilers map PTX to Python lines
    fp_contract: bool = False    # allow a*b+c -> fma (one rounding; results then differ by ulps)
    opt_level: int = 3
    max_threads: int = 0         # launch bound: at most this many threads per block (.maxntid)
    min_blocks: int = 0          # with max_threads: keep this many blocks per SM (.minnctapersm)
    pdl: bool = True             # sm_90+: may start early under programmatic dependent launch


@dataclass
class KernelContext:
    module: ir.Module
    function: ir.Function
    target: object
    options: Options
    kernel_name: str
    builder: ir.IRBuilder = None
    entry: ir.Block = None
    exit_block: ir.Block = None
    sites: list = field(default_factory=list)
    origins: dict = field(default_factory=dict)
    call_stack: list = field(default_factory=list)
    shared: list = field(default_factory=list)        # (name, ArrayType, offset) static shared
    shared_bytes: int = 0
    local_bytes: int = 0                              # pk.local_array bytes per thread so far
    uses: set = field(default_factory=set)            # features used: "barrier", "warp", ...
    min_arch: tuple = (75, "")                        # (sm number, instruction that needs it)
    target_data: dict = field(default_factory=dict)   # per-target scratch (e.g. CPU params)
    _decls: dict = field(default_factory=dict)
    _debug: object = None
    _strings: dict = field(default_factory=dict)

    def constant_string(self, text: str, addrspace: int = 0) -> ir.Value:
        """A NUL-terminated constant C string in the module (one global per text and address
        space), as an i8* in that address space."""
        key = (text, addrspace)
        g = self._strings.get(key)
        if g is None:
            data = bytearray(text.encode() + b"\0")
            ty = ir.ArrayType(ir.IntType(8), len(data))
            g = ir.GlobalVariable(self.module, ty, self.module.get_unique_name("str"),
                                  addrspace=addrspace)
            g.global_constant, g.linkage = True, "internal"
            g.initializer = ir.Constant(ty, data)
            self._strings[key] = g
        zero = ir.Constant(ir.IntType(32), 0)
        return self.builder.gep(g, [zero, zero])

    def append_block(self, name: str) -> ir.Block:
        return self.function.append_basic_block(name)

    def new_block(self, name: str) -> ir.Block:
        bb = self.append_block(name)
        self.builder.position_at_end(bb)
        return bb

    def alloca(self, ty: ir.Type, name: str = "") -> ir.AllocaInstr:
        """Stack slots live in the entry block so LLVM promotes them to registers."""
        b = ir.IRBuilder(self.entry)
        if self.entry.is_terminated:
            b.position_before(self.entry.terminator)
        return b.alloca(ty, name=name)

    def ptr_llvm(self, ty: PtrType) -> ir.Type:
        return self.target.pointer_type(ty)

    def intrinsic_decl(self, name: str, *types: ir.Type, ret: ir.Type = None,
                       args: tuple = None) -> ir.Function:
        """Declare an LLVM intrinsic once: overloaded ones get the type suffix (llvm.floor.f32)."""
        suffix = "".join("." + _mangle(t) for t in types)
        full = name + suffix if not name.startswith("llvm.nvvm") else name
        fn = self.module.globals.get(full)
        if fn is None:
            ret_ty = ret or types[0]
            arg_tys = args if args is not None else ((types[0],) * _arity(name))
            fn = ir.Function(self.module, ir.FunctionType(ret_ty, arg_tys), full)
        return fn

    def site(self, fl, node, kind: str) -> int:
        err = fl.fast.error(node, kind)
        self.sites.append(Site(kind, err.file, err.line, err.col, err.source_line))
        return len(self.sites) - 1

    def require_arch(self, sm: int, what: str, fl, node):
        """Instructions the target arch lacks are compile errors naming the minimum arch."""
        arch = self.target.sm
        if arch is not None and arch < sm:
            from ..errors import UnsupportedArchError
            err = fl.fast.error(node, f"{what} needs sm_{sm} or newer; compiling for "
                                f"sm_{arch}", hint=f"compile with arch='sm_{sm}' or newer")
            raise UnsupportedArchError(err.message, err.file, err.line, err.col, err.end_col,
                                       err.source_line, err.hint) from None
        if sm > self.min_arch[0]:
            self.min_arch = (sm, what)

    def set_location(self, fl, node):
        if self._debug is not None:
            self._debug.set_location(self.builder, fl.fast, node)


def _mangle(t: ir.Type) -> str:
    if isinstance(t, ir.FloatType):
        return "f32"
    if isinstance(t, ir.DoubleType):
        return "f64"
    if isinstance(t, ir.HalfType):
        return "f16"
    if str(t) == "bfloat":        # ops.BFloatType (llvmlite has none of its own)
        return "bf16"
    if isinstance(t, ir.VectorType):                     # <2 x half>: v2f16
        return f"v{t.count}{_mangle(t.element)}"
    if isinstance(t, ir.IntType):
        return f"i{t.width}"
    raise TypeError(t)


def _arity(name: str) -> int:
    return {"llvm.fma": 3, "llvm.minnum": 2, "llvm.maxnum": 2, "llvm.copysign": 2,
            "llvm.pow": 2}.get(name, 1)
