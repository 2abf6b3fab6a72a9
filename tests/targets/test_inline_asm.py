"""pk.asm: inline PTX with one result, a tuple of results, or none; its errors."""
import shutil
import subprocess

import numpy as np
import pytest

import pykernel as pk
from pykernel import Ptr, i32, u32


@pk.kernel
def asm_ops(a: Ptr[i32, "ro"], out: Ptr[i32]):
    i = pk.thread_idx.x
    s = pk.asm("add.s32 $0, $1, $2;", "=r,r,r", i32, a[i], 5)
    lo, hi = pk.asm("mov.b64 {$0, $1}, $2;", "=r,=r,l", (u32, u32), pk.i64(a[i]) << 32)
    pk.asm("membar.cta;", "~{memory}", None)
    out[i] = s + i32(lo) + i32(hi)


def test_asm_result_shapes_in_ptx():
    ptx = asm_ops.ptx("sm_90")
    for text in ("add.s32", "mov.b64", "membar.cta;"):
        assert text in ptx, text


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not installed")
def test_asm_assembles(tmp_path):
    src = tmp_path / "asm.ptx"
    src.write_text(asm_ops.ptx("sm_90"))
    proc = subprocess.run(["ptxas", "-arch=sm_90", str(src), "-o", str(tmp_path / "a.cubin")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_asm_on_the_cpu_target_is_a_source_error():
    with pytest.raises(pk.KernelSourceError, match="no CPU-target equivalent"):
        asm_ops.compile("cpu")


def test_asm_needs_literal_strings():
    @pk.kernel
    def bad(out: Ptr[i32], t: i32):
        out[0] = pk.asm(t, "=r", i32)
    with pytest.raises(pk.KernelSourceError, match="literal PTX template"):
        bad.compile("sm_90")


@pytest.mark.gpu
def test_asm_runs_on_the_gpu():
    from pykernel.runtime import device as dv
    if not dv.gpu_available():
        pytest.skip("no usable CUDA GPU (driver missing or no device)")
    pk.set_device("cuda")
    a = np.arange(32, dtype=np.int32)
    out = pk.full(32, -1, np.int32)
    asm_ops[1, 32](pk.to_device(a), out)
    np.testing.assert_array_equal(out.numpy(), a + 5 + a)   # lo = 0, hi = a
