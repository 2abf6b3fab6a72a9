"""Array API on host memory (the cpu device's arrays): creation, transfers, views, interop."""
import gc

import numpy as np
import pytest

from pykernel.runtime import arrays as ar
from pykernel.runtime import dlpack
from tests.runtime.fakes import FakeHostDevice

DTYPES = [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int32, np.uint32, np.int64,
          np.bool_]


@pytest.fixture
def dev():
    return FakeHostDevice()


def random_array(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_to_device_roundtrip(rng, seed, dev, dtype):
    host = random_array(rng, (7, 13), dtype)
    x = ar.to_device(host, device=dev)
    assert (x.shape, x.dtype, x.nbytes, x.size, x.ndim) == \
        (host.shape, host.dtype, host.nbytes, host.size, 2)
    assert x.ptr % 64 == 0, "host allocations are cache-line aligned"
    host_copy = host.copy()
    host[...] = host[0, 0]  # to_device copied: later host writes must not show
    np.testing.assert_array_equal(x.numpy(), host_copy, err_msg=f"seed={seed}")


def test_creation_functions(dev):
    assert np.all(ar.zeros((3, 5), np.int32, device=dev).numpy() == 0)
    np.testing.assert_array_equal(ar.full(4, 2.5, np.float32, device=dev).numpy(),
                                  np.full(4, 2.5, np.float32))
    e = ar.empty(0, np.float32, device=dev)
    assert e.shape == (0,) and e.numpy().shape == (0,)
    with pytest.raises(TypeError, match="bool, integer or float"):
        ar.empty(3, np.complex64, device=dev)
    with pytest.raises(ValueError, match="negative"):
        ar.empty((2, -1), device=dev)
    with pytest.raises(TypeError, match="shape"):
        ar.empty("abc", device=dev)


def test_big_endian_input_is_converted(dev):
    host = np.arange(6, dtype=">i4")
    x = ar.to_device(host, device=dev)
    assert x.dtype == np.dtype(np.int32)
    np.testing.assert_array_equal(x.numpy(), np.arange(6))


def test_views_share_memory_and_offset_pointers(rng, seed, dev):
    host = random_array(rng, (6, 4, 5), np.float32)
    x = ar.to_device(host, device=dev)
    item = 4
    cases = [((2,), 2 * 20), ((slice(1, 4),), 20), ((3, 2), 3 * 20 + 2 * 5),
             ((1, slice(1, 3)), 20 + 5), ((2, slice(None), slice(None)), 40), ((-1,), 5 * 20),
             ((4, 3, 2), 4 * 20 + 3 * 5 + 2)]
    for index, offset in cases:
        view = x[index]
        assert view.ptr == x.ptr + offset * item, f"{index} seed={seed}"
        np.testing.assert_array_equal(view.numpy(), host[index], err_msg=f"{index} seed={seed}")
    block = random_array(rng, (2, 4, 5), np.float32)
    x[1:3] = block              # write through a view
    host[1:3] = block
    x[5, 1] = 7.0               # fill through a view
    host[5, 1] = 7.0
    np.testing.assert_array_equal(x.numpy(), host, err_msg=f"seed={seed}")


def test_non_contiguous_and_bad_indices_rejected(dev):
    x = ar.zeros((4, 6), device=dev)
    for index in [(slice(None), 2), (slice(0, 2), slice(1, 3)), (slice(0, 4, 2),)]:
        with pytest.raises(IndexError):
            x[index]
    with pytest.raises(IndexError, match="out of bounds"):
        x[4]
    with pytest.raises(IndexError, match="too many"):
        x[1, 2, 3]


def test_reshape_and_view(rng, seed, dev):
    host = random_array(rng, (4, 6), np.float32)
    x = ar.to_device(host, device=dev)
    np.testing.assert_array_equal(x.reshape(3, -1).numpy(), host.reshape(3, -1))
    np.testing.assert_array_equal(x.reshape((24,)).numpy(), host.reshape(24))
    assert x.reshape(2, 12).ptr == x.ptr
    with pytest.raises(ValueError):
        x.reshape(5, 5)
    np.testing.assert_array_equal(x.view(np.uint32).numpy(), host.view(np.uint32))
    np.testing.assert_array_equal(x.view(np.uint8).numpy(), host.view(np.uint8),
                                  err_msg=f"seed={seed}")
    np.testing.assert_array_equal(x.view(np.uint8).view(np.float32).numpy(), host)
    with pytest.raises(ValueError, match="multiple"):
        ar.zeros(3, np.uint8, device=dev).view(np.float32)
    for bad in ((-2, -12), (2, -1, -1), (-1, 5)):
        with pytest.raises(ValueError):
            x.reshape(bad)
    with pytest.raises(TypeError):
        x.reshape(2.0, 12)
    assert x.reshape(np.int64(4), np.int32(6)).shape == (4, 6)
    flat = x[1:3].reshape(-1)                  # the flattening fast path: a view at the offset
    assert flat.shape == (12,) and flat.ptr == x.ptr + 24 and flat.dtype == np.float32
    np.testing.assert_array_equal(flat.numpy(), host[1:3].reshape(-1))
    assert ar.zeros((), np.float32, device=dev).reshape(-1).shape == (1,)   # as numpy
    assert ar.zeros((0, 3), np.float32, device=dev).reshape(-1).shape == (0,)


def test_view_as_reuses_a_buffer(rng, seed, dev):
    host = random_array(rng, (4, 6), np.float32)
    x = ar.to_device(host, device=dev)
    v = x.view_as((2, 5), np.float32)
    assert v.ptr == x.ptr and v.shape == (2, 5)
    np.testing.assert_array_equal(v.numpy(), host.reshape(-1)[:10].reshape(2, 5),
                                  err_msg=f"seed={seed}")
    np.testing.assert_array_equal(x.view_as((3,), np.uint16).numpy(),
                                  host.view(np.uint16).reshape(-1)[:3])
    with pytest.raises(ValueError, match="96 bytes"):
        x.view_as((5, 5), np.float32)


def test_copy_from_checks(rng, dev):
    x = ar.zeros(5, np.float32, device=dev)
    with pytest.raises(ValueError, match="float64"):
        x.copy_from(np.zeros(5))
    with pytest.raises(ValueError, match=r"\(4,\)"):
        x.copy_from(np.zeros(4, np.float32))
    y = ar.to_device(np.arange(5, dtype=np.float32), device=dev)
    x.copy_from(y)
    np.testing.assert_array_equal(x.numpy(), np.arange(5))
    with pytest.raises(ValueError, match="source is on"):
        x.copy_from(ar.zeros(5, np.float32, device=FakeHostDevice()))


def test_numpy_into_an_out_array(rng, seed, dev):
    host = rng.standard_normal((3, 7)).astype(np.float32)
    x = ar.to_device(host, device=dev)
    out = ar.pinned_empty((3, 7), np.float32, device=dev)
    out[...] = np.nan                               # poisoned: every element must be copied
    assert x.numpy(out=out) is out
    np.testing.assert_array_equal(out, host, err_msg=f"seed={seed}")
    with pytest.raises(ValueError, match=r"\(7, 3\)"):
        x.numpy(out=np.empty((7, 3), np.float32))
    with pytest.raises(ValueError, match="float64"):
        x.numpy(out=np.empty((3, 7)))
    with pytest.raises(ValueError, match="C-contiguous"):
        x.numpy(out=np.empty((7, 3), np.float32).T)
    with pytest.raises(TypeError, match="numpy array"):
        x.numpy(out=[0.0] * 21)


def test_numpy_interop_is_zero_copy_on_cpu(dev):
    x = ar.to_device(np.arange(6, dtype=np.int32).reshape(2, 3), device=dev)
    view = np.asarray(x)
    view[1, 2] = 99
    assert x.numpy()[1, 2] == 99
    assert not hasattr(x, "__cuda_array_interface__")
    assert x.__dlpack_device__() == (dlpack.KDL_CPU, 0)


def test_dlpack_export_to_numpy_keeps_memory_alive(rng, seed, dev):
    host = random_array(rng, (5, 3), np.float64)
    x = ar.to_device(host, device=dev)
    consumed = np.from_dlpack(x)
    np.testing.assert_array_equal(consumed, host, err_msg=f"seed={seed}")
    consumed[0, 0] = -1.0       # same memory
    assert x.numpy()[0, 0] == -1.0
    del x
    gc.collect()
    assert dlpack._LIVE, "the exported tensor must keep the allocation alive"
    consumed[4, 2] = 3.0        # still valid memory: the capsule kept the owner alive
    assert consumed[4, 2] == 3.0
    del consumed
    gc.collect()
    assert not dlpack._LIVE, "the consumer's deleter must release the exported tensor"


def test_dlpack_unconsumed_capsule_is_released(dev):
    x = ar.zeros(3, device=dev)
    capsule = x.__dlpack__()
    assert dlpack._LIVE
    del capsule
    gc.collect()
    assert not dlpack._LIVE


def test_dlpack_read_describes_numpy(rng):
    host = random_array(rng, (4, 6), np.int16)
    view = dlpack.read_dlpack(host)
    assert (view.ptr, view.shape, view.dtype, view.device_type) == \
        (host.ctypes.data, (4, 6), np.dtype(np.int16), dlpack.KDL_CPU)
    assert view.is_c_contiguous() and not dlpack.read_dlpack(host[:, ::2]).is_c_contiguous()


def test_copy_from_host_async_in_stream_order(rng, seed, device):
    """copy_from_host_async from page-locked memory: a read-back queued after it (the default
    stream, or a synchronized stream) sees every element; wrong layouts are refused."""
    import pykernel as pk
    host = pk.pinned_empty((4, 9), np.float32)
    host[...] = rng.standard_normal((4, 9))
    x = pk.full((4, 9), np.nan, np.float32)                # poisoned
    assert x.copy_from_host_async(host) is x
    np.testing.assert_array_equal(x.numpy(), host, err_msg=f"seed={seed}")
    stream = pk.Stream()
    host[...] = rng.standard_normal((4, 9))
    x.copy_from_host_async(host, stream)
    stream.synchronize()
    np.testing.assert_array_equal(x.numpy(), host, err_msg=f"seed={seed}")
    with pytest.raises(ValueError, match=r"\(9, 4\)"):
        x.copy_from_host_async(np.zeros((9, 4), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        x.copy_from_host_async(np.zeros((9, 4), np.float32).T)
    with pytest.raises(TypeError, match="numpy array"):
        x.copy_from_host_async([0.0] * 36)
