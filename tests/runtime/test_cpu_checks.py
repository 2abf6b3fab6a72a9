"""Runtime checks on the CPU target: out-of-bounds accesses, barriers in divergent control
flow and failed asserts raise KernelRuntimeError naming the kernel and source line (never a
segfault or a hang); launch arguments are checked against the signature."""
import numpy as np
import pytest

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32


pytestmark = pytest.mark.usefixtures("cpu_device")


@pk.kernel
def reads_past_end(x: Ptr[f32], out: Ptr[f32], n: i32):
    i = pk.thread_idx.x
    out[i] = x[i + n]          # OOB-LINE


@pk.kernel
def writes_shared_past_end(out: Ptr[f32]):
    buf = pk.shared_array(f32, 8)
    t = pk.thread_idx.x
    buf[t] = 1.0               # SHARED-LINE
    out[0] = buf[0]


@pk.kernel
def divergent_barrier(out: Ptr[f32]):
    t = pk.thread_idx.x
    if t < 16:
        pk.syncthreads()       # BARRIER-A
    else:
        pk.syncthreads()       # BARRIER-B
    out[t] = 1.0


@pk.kernel(debug=True)
def checked(out: Ptr[i32], n: i32):
    t = pk.thread_idx.x
    assert t < n               # ASSERT-LINE
    out[t] = t


def test_out_of_bounds_read_reports_kernel_and_line():
    x, out = pk.zeros(8, np.float32), pk.zeros(8, np.float32)
    with pytest.raises(pk.KernelRuntimeError) as info:
        reads_past_end[1, 8](x, out, 4)
    text = str(info.value)
    assert "reads_past_end" in text and "out-of-bounds" in text and "OOB-LINE" in text


def test_in_bounds_access_is_fine():
    x, out = pk.to_device(np.arange(8, dtype=np.float32)), pk.zeros(4, np.float32)
    reads_past_end[1, 4](x, out, 4)
    assert list(out.numpy()) == [4, 5, 6, 7]


def test_out_of_bounds_shared_write():
    with pytest.raises(pk.KernelRuntimeError, match="SHARED-LINE"):
        writes_shared_past_end[1, 16](pk.zeros(1, np.float32))


def test_divergent_barrier_is_diagnosed_not_hung():
    with pytest.raises(pk.KernelRuntimeError) as info:
        divergent_barrier[1, 32](pk.zeros(32, np.float32))
    assert "divergent" in str(info.value) and "divergent_barrier" in str(info.value)


def test_assert_in_debug_mode():
    out = pk.zeros(32, np.int32)
    checked[1, 32](out, 32)
    with pytest.raises(pk.KernelRuntimeError, match="ASSERT-LINE"):
        checked[1, 32](out, 10)


@pk.kernel
def typed(x: Ptr[f32], n: i32, k: u32, scale: f32, BLOCK: Const[int]):
    x[0] = scale


def test_launch_argument_errors_name_kernel_parameter_expected_given():
    x = pk.zeros(4, np.float32)
    with pytest.raises(pk.LaunchError, match=r"typed\(\).*'x'.*float32.*float64"):
        typed[1, 1](pk.zeros(4, np.float64), 1, 1, 1.0, 32)
    with pytest.raises(pk.LaunchError, match=r"'k'"):
        typed[1, 1](x, 1, -1, 1.0, 32)           # -1 does not fit u32
    with pytest.raises(pk.LaunchError, match=r"'n'"):
        typed[1, 1](x, 2**40, 1, 1.0, 32)        # does not fit i32
    with pytest.raises(pk.LaunchError, match="missing"):
        typed[1, 1](x, 1, 1)
    with pytest.raises(pk.LaunchError):
        typed[0, 1](x, 1, 1, 1.0, 32)            # empty grid


def test_const_parameters_by_keyword_make_specialisations():
    x = pk.zeros(4, np.float32)
    typed[1, 1](x, 1, 1, 2.5, BLOCK=64)
    typed[1, 1](x=x, n=1, k=1, scale=3.5, BLOCK=128)
    assert x.numpy()[0] == 3.5
    assert len(typed._launch_cache) >= 2


@pk.kernel
def reads_unwritten_shared(out: Ptr[f32], bits: Ptr[u32], n: i32):
    """Thread t writes shared slot t + 1 after the barrier, but reads slot t before it: slot 0
    of a block is never written in this launch."""
    buf = pk.shared_array(f32, 33)
    raw = pk.dynamic_shared(u32)
    t = pk.thread_idx.x
    out[pk.block_idx.x * n + t] = buf[t]
    bits[pk.block_idx.x * n + t] = raw[t]
    pk.syncthreads()
    buf[t + 1] = 1.0
    raw[t] = u32(7)


def test_shared_memory_starts_poisoned_each_launch():
    """Shared memory is undefined when a block starts on a GPU; the CPU target makes it 0xFF
    bytes at each launch (NaN floats, all-ones integers), so a kernel that reads what it did
    not write sees poison in tests instead of zeros or the last launch's values."""
    out = pk.empty((1, 32), np.float32)
    bits = pk.empty((1, 32), np.uint32)
    for _ in range(2):                            # the first launch left 1.0 and 7 behind
        reads_unwritten_shared[1, 32, None, 128](out, bits, 32)
        assert np.isnan(out.numpy()).all()
        assert (bits.numpy() == 0xFFFFFFFF).all()


@pk.kernel
def vector_copy(x: Ptr[u32, "ro"], out: Ptr[u32], start: i32, W: Const[int]):
    i = start + W * pk.thread_idx.x
    if W == 2:
        a, b = pk.load_vec(x, i, 2)          # VEC-LOAD-LINE
        pk.store_vec(out, W * pk.thread_idx.x, (a, b))
    else:
        a, b, c, d = pk.load_vec(x, i, 4)    # VEC-LOAD-LINE
        pk.store_vec(out, W * pk.thread_idx.x, (a, b, c, d))


@pytest.mark.parametrize("width", [2, 4])
def test_misaligned_vector_load_is_reported_not_silently_loaded(width):
    """An 8- or 16-byte load from an index that is not a multiple of the width: the GPU faults
    (misaligned address); the CPU target must say so at the line, not load the bytes."""
    x = pk.to_device(np.arange(64, dtype=np.uint32))
    out = pk.full((32,), 0, np.uint32)
    vector_copy[1, 4](x, out, 0, W=width)          # aligned: fine
    np.testing.assert_array_equal(out.numpy()[:4 * width], np.arange(4 * width))
    for start in range(1, width):
        with pytest.raises(pk.KernelRuntimeError, match="VEC-LOAD-LINE") as info:
            vector_copy[1, 4](x, out, start, W=width)
        assert "misaligned" in str(info.value)
