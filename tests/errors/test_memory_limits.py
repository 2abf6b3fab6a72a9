"""Issue 45, item 5: arrays larger than a GPU holds are source errors at their declaration on
every target. `pk.local_array(f32, 2**21)` (8 MiB per thread) killed the process on the CPU
target (rc -11) and only made LLVM warn at 2**31. Limit: 512 KiB of local arrays per thread
(summed over the kernel's arrays)."""
import os

import numpy as np
import pytest

import pykernel as pk
from tests.errors.markers import line_of as marker_line
from pykernel import Const, Ptr, f32, f64

THIS_FILE = os.path.abspath(__file__)
ARCHS = ["sm_90", "cpu"]


def line_of(marker: str) -> int:
    return marker_line(THIS_FILE, marker)


@pk.kernel
def local_of(x: Ptr[f32], N: Const[int]):
    a = pk.local_array(f32, N)  # MARK-local
    a[0] = x[0]
    x[1] = a[0]


@pk.kernel
def shared_of(x: Ptr[f32], N: Const[int]):
    s = pk.shared_array(f32, N)  # MARK-shared
    s[pk.thread_idx.x] = x[0]
    x[1] = s[0]


@pk.func
def scratch(v: f32) -> f32:
    b = pk.local_array(f64, 40000)  # MARK-func-local
    b[0] = f64(v)
    return f32(b[0])


@pk.kernel
def two_locals(x: Ptr[f32]):
    a = pk.local_array(f32, (256, 256))
    a[0, 0] = x[0]
    x[1] = scratch(a[0, 0])


def located(err, marker, underlined):
    assert (err.file, err.line) == (THIS_FILE, line_of(marker)), str(err)
    assert err.source_line[err.col:].startswith(underlined), str(err)
    # no compiler frames: the message names the user's file alone (a checkout may itself sit
    # in a folder called pykernel, so look for the compiler's own modules)
    internals = (os.path.join("pykernel", d) for d in ("lower", "intrinsics", "targets"))
    assert err.__cause__ is None and not any(d in str(err) for d in internals), str(err)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("n", [2**21, 2**31, 131073])
def test_local_array_over_512_kib_is_a_source_error(arch, n):
    with pytest.raises(pk.KernelSourceError, match=r"local memory per thread; CUDA allows "
                       r"at most 524288 \(512 KiB\)") as info:
        local_of.compile(arch, N=n)
    located(info.value, "MARK-local", "pk.local_array(f32, N)")
    assert f"pk.local_array of {4 * n} bytes" in str(info.value)
    assert "hint: keep large data in global memory" in str(info.value)


@pytest.mark.parametrize("arch", ARCHS)
def test_local_arrays_add_up_across_inlined_functions(arch):
    with pytest.raises(pk.KernelSourceError, match=r"320000 bytes \(262144 bytes declared "
                       r"before it\): 582144 bytes") as info:
        two_locals.compile(arch)
    located(info.value, "MARK-func-local", "pk.local_array(f64, 40000)")


def test_local_array_at_the_limit_runs_on_the_cpu():
    pk.set_device("cpu")
    x = pk.to_device(np.array([3.0, 0.0], np.float32))
    local_of[1, 32](x, 131072)
    assert x.numpy()[1] == 3.0


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("n", [58113, 2**40, 256**32])
def test_shared_array_no_gpu_holds_is_a_source_error(arch, n):
    """One static shared array over 227 KiB (found by the source fuzzer: `BLOCK ** 32`
    elements made invalid LLVM IR)."""
    with pytest.raises(pk.KernelSourceError, match=r"a block has at most 232448 bytes") as info:
        shared_of.compile(arch, N=n)
    located(info.value, "MARK-shared", "pk.shared_array(f32, N)")
    assert f"pk.shared_array of {4 * n} bytes" in str(info.value)


@pytest.mark.parametrize("arch", ARCHS)
def test_shared_array_at_the_limit_compiles(arch):
    shared_of.compile(arch, N=58112)          # 232448 bytes: the most an sm_90 block has
