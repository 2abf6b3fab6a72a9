"""What the atomics look like in PTX: `atom.*` even when the result is unused (LLVM's NVPTX
never emits `red.*`; ptxas turns such an add / max / min into the SASS reduction REDG, see
docs/language.md "Memory"), assembled for every arch."""
import pytest

import pykernel as pk
from pykernel import Ptr, f32, f64, i32, u64


@pk.kernel
def discarded_atomics(p: Ptr[f32], q: Ptr[i32], r: Ptr[u64], s: Ptr[f64]):
    pk.atomic_add(p, 0, f32(1.0))
    pk.atomic_add(q, 0, 1)
    pk.atomic_max(q, 1, 3)
    pk.atomic_min(q, 2, 3)
    pk.atomic_add(r, 0, u64(1))
    pk.atomic_add(s, 0, f64(1.0))


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
def test_discarded_atomics_are_atom_in_ptx(arch, assemble):
    ptx = discarded_atomics.ptx(arch)
    for instr in ("atom.global.add.f32", "atom.global.add.u32", "atom.global.max.s32",
                  "atom.global.min.s32", "atom.global.add.u64", "atom.global.add.f64"):
        assert instr in ptx, instr
    assert "red." not in ptx
    assemble(ptx, arch)
