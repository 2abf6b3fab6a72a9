"""What every target shares: the decisions the compiler asks it about, and its table of
intrinsic lowerings.

`compiler.py` asks the target, never its name: `hidden_params(params, options)` (parameters
the target appends to a kernel's own), `debug_info(module, fn, fast, options)` (line tables,
or None), `emit(ref, options, ctx)` (stage 4) and `RESULT_FIELD` (the `CompiledKernel` field
that holds what emit returns).

An intrinsic (intrinsics/) checks its arguments, then asks the target for its own form:
`target.lower_intrinsic(name, fl, *operands)` calls the target's INTRINSICS[name] and returns its
IR, or None where the target has no entry and the portable IR written in intrinsics/ applies.
`has_intrinsic(name)` asks first where an intrinsic changes course before its operands are
evaluated (pk.fast.*, pk.asm). A target module's table is the whole of what it adds."""
from __future__ import annotations


class Target:
    name: str = ""
    INTRINSICS: dict = {}    # intrinsic name -> lowering function (fl, *operands) -> IR
    RESULT_FIELD: str = ""   # CompiledKernel field of emit's result ("ptx", "cpu")

    def hidden_params(self, params, options) -> list:
        """(name, type) parameters appended to the kernel's own; none by default."""
        return []

    def debug_info(self, module, fn, fast, options):
        """The line-table builder of lower/debuginfo.py for this kernel, or None (default: the
        target emits no line tables)."""
        return None

    def tracks_pointer_bounds(self, ctx) -> bool:
        """Whether this compilation checks memory accesses against the origin of the pointer
        (then a pointer chosen at run time carries its bounds: lower/ptr_bounds.py)."""
        return False

    def pointer_bounds(self, ctx, origin):
        """(base i8*, byte size i64) of the memory `origin` names, computed at the builder's
        position, or None where this target does not bound it."""
        return None

    def emit(self, ref, options, ctx):
        """Stage 4: the verified LLVM module `ref` -> this target's result."""
        raise NotImplementedError(f"target {self.name!r} has no emit")

    def has_intrinsic(self, name: str) -> bool:
        return name in self.INTRINSICS

    def lower_intrinsic(self, name: str, fl, *operands):
        lower = self.INTRINSICS.get(name)
        return None if lower is None else lower(fl, *operands)
