"""N-d array parameters (`pk.Array[T, rank]`) at run time: 1-d/2-d/3-d kernels against numpy,
non-contiguous views (transposes, stepped and reversed slices, DLPack and CUDA array interface
views), shape/strides as the kernel sees them, indexes past 2^31 elements, per-dimension
index errors and launch errors naming kernel, parameter, rank and dtype."""
import mmap

import numpy as np
import pytest

import pykernel as pk
from pykernel import f32, i32, i64


@pk.kernel
def scale1(x: pk.Array[f32, 1, "ro"], out: pk.Array[f32, 1], alpha: f32):
    i = i64(pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x)
    if i < out.shape[0]:
        out[i] = alpha * x[i]


@pk.kernel
def add2(x: pk.Array[f32, 2, "ro"], y: pk.Array[f32, 2, "ro"], out: pk.Array[f32, 2]):
    r = i64(pk.block_idx.y * pk.block_dim.y + pk.thread_idx.y)
    c = i64(pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x)
    if r < out.shape[0] and c < out.shape[1]:
        out[r, c] = x[r, c] + y[r, c]


@pk.kernel
def mix3(x: pk.Array[f32, 3, "ro"], out: pk.Array[f32, 3]):
    # one thread per (i, j, k): out = x + 100 i + 10 j + k, with i32 indexes
    i, j, k = pk.block_idx.z, pk.block_idx.y, pk.thread_idx.x
    if k < i32(out.shape[2]):
        out[i, j, k] = x[i, j, k] + f32(100 * i + 10 * j + k)


@pk.kernel
def layout(x: pk.Array[f32, 3, "ro"], out: pk.Array[i64, 1]):
    for d in pk.static_range(3):
        out[d] = x.shape[d]
        out[3 + d] = x.strides[d]
    out[6] = x.ndim


def grid2(shape, block=(16, 4)):
    return ((shape[1] + block[0] - 1) // block[0], (shape[0] + block[1] - 1) // block[1]), block


def poisoned(shape, dtype=np.float32):
    return np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -1, dtype)


def test_1d_2d_3d_on_device_arrays(device, rng):
    n = int(rng.integers(900, 1100))
    a = rng.standard_normal(n, np.float32)
    out = pk.to_device(poisoned(n))
    scale1[(n + 127) // 128, 128](pk.to_device(a), out, 1.5)
    np.testing.assert_array_equal(out.numpy(), np.float32(1.5) * a)

    shape = tuple(int(v) for v in rng.integers(30, 70, 2))     # e.g. 45 x 65
    a, b = rng.standard_normal(shape, np.float32), rng.standard_normal(shape, np.float32)
    out = pk.to_device(poisoned(shape))
    add2[grid2(shape)](pk.to_device(a), pk.to_device(b), out)
    np.testing.assert_array_equal(out.numpy(), a + b)

    shape3 = (3, 5, 7)
    x = rng.standard_normal(shape3, np.float32)
    out = pk.to_device(poisoned(shape3))
    mix3[(1, 5, 3), 8](pk.to_device(x), out)
    i, j, k = np.indices(shape3)
    np.testing.assert_array_equal(out.numpy(), x + (100 * i + 10 * j + k).astype(np.float32))


def test_non_contiguous_host_views(rng):
    pk.set_device("cpu")
    base = rng.standard_normal((61, 90), np.float32)
    views = [base.T, base[::3, 1::2], base[::-1, ::-2], base[5:40:4, ::-7].T]
    for view in views:
        other = rng.standard_normal(view.shape, np.float32)
        out_base = poisoned((view.shape[1], view.shape[0]))
        out = out_base.T                     # a transposed output view too
        add2[grid2(view.shape)](view, other, out)
        np.testing.assert_array_equal(out, view + other)
        np.testing.assert_array_equal(out_base, (view + other).T)


class DLPackOnly:
    """An array known to the launch only through __dlpack__ (as torch tensors are)."""

    def __init__(self, array):
        self.array, self.shape, self.dtype = array, array.shape, array.dtype

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_views_through_dlpack_and_shape_strides(rng):
    pk.set_device("cpu")
    base = rng.standard_normal((4, 6, 10), np.float32)
    view = base[::-1, 1::2, ::3].transpose(2, 0, 1)
    out = poisoned(7, np.int64)
    layout[1, 1](DLPackOnly(view), out)
    expected = list(view.shape) + [s // 4 for s in view.strides] + [3]
    assert out.tolist() == expected
    result = poisoned(view.shape)
    mix3[(1, view.shape[1], view.shape[0]), 8](DLPackOnly(view), result)
    i, j, k = np.indices(view.shape)
    np.testing.assert_array_equal(result, view + (100 * i + 10 * j + k).astype(np.float32))


class CudaView:
    """A strided view of device memory through __cuda_array_interface__ (as CuPy/torch)."""

    def __init__(self, ptr, shape, strides_bytes, typestr="<f4"):
        self.__cuda_array_interface__ = {"shape": shape, "strides": strides_bytes,
                                         "typestr": typestr, "data": (ptr, False),
                                         "version": 3}


@pytest.mark.gpu
def test_transposed_cuda_array_interface_view(rng):
    pk.set_device("cuda")
    a = rng.standard_normal((37, 53), np.float32)
    da = pk.to_device(a)
    view = CudaView(da.ptr, (53, 37), (4, 53 * 4))          # a.T without a copy
    other = rng.standard_normal((53, 37), np.float32)
    out = pk.to_device(poisoned((53, 37)))
    add2[grid2((53, 37))](view, pk.to_device(other), out)
    np.testing.assert_array_equal(out.numpy(), a.T + other)


@pk.kernel
def read_far(x: pk.Array[pk.i8, 2, "ro"], r: i32, c: i32, out: pk.Array[pk.i8, 1]):
    out[0] = x[r, c]          # i32 indexes; the offset r * stride + c needs 64 bits
    out[1] = x[r, c + 1]


def test_offsets_past_two_to_the_31_elements():
    """A 2 x (2^30 + 64) i8 view of a lazily mapped 2 GiB buffer: element [1, 2^30 + 10] is
    2^31 + 74 elements in, past what 32-bit offsets reach; only the touched pages are real."""
    pk.set_device("cpu")
    cols = (1 << 30) + 64
    try:
        buf = mmap.mmap(-1, 2 * cols)
    except (OSError, ValueError, OverflowError) as exc:
        pytest.skip(f"cannot map 2 GiB of address space: {exc}")
    try:
        x = np.frombuffer(buf, np.int8).reshape(2, cols)
        x[1, (1 << 30) + 10], x[1, (1 << 30) + 11] = 42, -7
        out = poisoned(2, np.int8)
        read_far[1, 1](x, 1, (1 << 30) + 10, out)
        assert out.tolist() == [42, -7]
        del x
    finally:
        buf.close()


def test_index_out_of_range_names_dimension_index_and_extent():
    pk.set_device("cpu")
    a = np.zeros((5, 9), np.int8)
    with pytest.raises(pk.KernelRuntimeError) as err:
        read_far[1, 1](a, 4, 9, poisoned(2, np.int8))     # column 9 of 9 in x
    message = str(err.value)
    assert "array index out of range" in message and "index 9, extent 9" in message
    assert "dimension 1 of 'x'" in message and "test_ndarray.py" in message
    assert "x[r, c]" in message
    with pytest.raises(pk.KernelRuntimeError, match=r"index -1, extent 1.*\n.*dimension 0 of "
                                                    r"'x'"):
        read_far[1, 1](np.zeros((1, 4), np.int8), -1, 0, poisoned(2, np.int8))


def test_launch_errors_name_kernel_parameter_rank_and_dtype():
    pk.set_device("cpu")
    ok = np.zeros((4, 4), np.float32)
    cases = [
        ((np.zeros((4, 4, 1), np.float32), ok, ok), "parameter 'x' expects a 2-d cpu array of "
         "f32 (Array[f32, 2, \"ro\"]), got a 3-d numpy.ndarray of float32 with shape "
         "(4, 4, 1); it has 3 dimensions, the parameter 2"),
        ((ok, np.zeros((4, 4), np.float64), ok), "parameter 'y' expects a 2-d cpu array of f32"
         " (Array[f32, 2, \"ro\"]), got a 2-d numpy.ndarray of float64 with shape (4, 4); "
         "element type is float64, the parameter's f32"),
        ((ok, ok, 3.0), "parameter 'out' expects a 2-d cpu array of f32 (Array[f32, 2]), got "
         "float 3.0"),
        ((ok, ok, np.lib.stride_tricks.as_strided(ok, (4, 4), (16, 6))), "byte strides (16, 6)"
         " are not whole elements of 4 bytes"),
    ]
    for args, expected in cases:
        with pytest.raises(pk.LaunchError) as err:
            add2[(1, 1), (4, 4)](*args)
        if "byte strides" in expected:
            assert expected in str(err.value)
        else:
            assert str(err.value) == "add2(): " + expected
    with pytest.raises(pk.LaunchError, match=r"add2\(\): missing argument\(s\) out"):
        add2[(1, 1), (4, 4)](ok, ok)


def test_graph_update_by_name_after_an_array_parameter(rng):
    """A host graph replays an Array launch; update_kernel_args names the parameters as the
    caller passes them (not the expanded ABI)."""
    pk.set_device("cpu")
    a = rng.standard_normal(50, np.float32)
    out = poisoned(50)
    with pk.capture_graph() as graph:
        scale1[1, 64](a, out, 2.0)
    graph.update_kernel_args(0, alpha=3.0)
    graph.replay()
    np.testing.assert_array_equal(out, np.float32(3.0) * a)
