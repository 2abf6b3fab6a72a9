"""Stage 2 (lower): LLVM IR text for key constructs, verified by LLVM, for both targets."""
import llvmlite.binding as llvm
import pytest

import pykernel as pk
from pykernel import Const, Ptr, f32, i32


@pk.kernel
def features(x: Ptr[f32, "ro"], out: Ptr[f32], n: i32, FLAG: Const[bool]):
    i = pk.thread_idx.x
    v = x[i]
    if FLAG:
        v = v * 2.0
    else:
        v = undefined_name_never_lowered  # noqa: F821 (dead branch: not type-checked)
    out[i] = pk.fma(v, v, 1.0) if i < n else f32(0.0)


@pytest.mark.parametrize("arch", ["sm_90", "cpu"])
def test_ir_verifies(arch):
    text = features.llvm_ir(arch, FLAG=True)
    llvm.parse_assembly(text).verify()
    assert "llvm.fma.f32" in text


def test_nvptx_ir_shape():
    text = features.llvm_ir("sm_90", FLAG=True)
    assert "ptx_kernel" in text
    assert "addrspace(1)" in text
    assert "!invariant.load" in text            # the read-only pointer's loads
    assert "llvm.nvvm.read.ptx.sreg.tid.x" in text


def test_compile_time_if_drops_dead_branch():
    with pytest.raises(pk.KernelSourceError, match="undefined_name_never_lowered"):
        features.llvm_ir("sm_90", FLAG=False)


def test_cpu_ir_uses_coroutines_only_when_synchronising():
    @pk.kernel
    def plain(out: Ptr[f32]):
        out[pk.thread_idx.x] = 1.0

    @pk.kernel
    def synced(out: Ptr[f32]):
        pk.syncthreads()
        out[pk.thread_idx.x] = 1.0
    assert "coro" not in plain.llvm_ir("cpu")
    assert "__pk_coro_suspend" in synced.llvm_ir("cpu")
