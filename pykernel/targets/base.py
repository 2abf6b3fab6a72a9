"""What every target shares: its table of intrinsic lowerings.

An intrinsic (intrinsics/) checks its arguments, then asks the target for its own form:
`target.lower_intrinsic(name, fl, *operands)` calls the target's INTRINSICS[name] and returns its
IR, or None where the target has no entry and the portable IR written in intrinsics/ applies.
`has_intrinsic(name)` asks first where an intrinsic changes course before its operands are
evaluated (pk.fast.*, pk.asm). A target module's table is the whole of what it adds."""
from __future__ import annotations


class IntrinsicTable:
    INTRINSICS: dict = {}    # intrinsic name -> lowering function (fl, *operands) -> IR

    def has_intrinsic(self, name: str) -> bool:
        return name in self.INTRINSICS

    def lower_intrinsic(self, name: str, fl, *operands):
        lower = self.INTRINSICS.get(name)
        return None if lower is None else lower(fl, *operands)
