"""ArgPacker: buffer layout, values written, and the LaunchError messages (no GPU needed: a
packer for device kind "cuda" only checks arguments and writes host memory)."""
import ctypes
import struct

import numpy as np
import pytest

from pykernel.errors import LaunchError
from pykernel.runtime import arrays as ar
from pykernel.runtime.packer import ArgPacker, f32_to_bf16_bits
from tests.runtime.fakes import FakeCompiled, FakeHostDevice, ptr, scalar

INT_TYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]


class FakeCudaArray:
    """Anything exposing __cuda_array_interface__ (torch/cupy stand-in)."""

    def __init__(self, address, shape, typestr, strides=None):
        self.__cuda_array_interface__ = {"data": (address, False), "shape": shape,
                                         "typestr": typestr, "strides": strides, "version": 3}


def mixed_kernel():
    return FakeCompiled("mixed", [scalar("flag", np.bool_), ptr("x", np.float32),
                                  scalar("n", np.uint32), scalar("scale", np.float16),
                                  scalar("offset", np.int64), scalar("w", "bfloat16"),
                                  scalar("eps", np.float64)])


def test_layout_aligns_every_field():
    packer = ArgPacker(mixed_kernel(), "cpu")
    assert packer.offsets == [0, 8, 16, 20, 24, 32, 40]
    assert packer.size == 48 and packer.address % 16 == 0
    pointers = (ctypes.c_void_p * 7).from_address(packer.params_address)
    assert [p - packer.address for p in pointers] == packer.offsets


def test_pack_writes_values_at_offsets(rng, seed):
    dev = FakeHostDevice()
    x = ar.zeros(3, np.float32, device=dev)
    packer = ArgPacker(mixed_kernel(), "cpu")
    n, offset = int(rng.integers(0, 2**32)), int(rng.integers(-2**63, 2**63))
    scale, eps = float(np.float16(rng.standard_normal())), float(rng.standard_normal())
    address = packer.pack((True, x, n, scale, offset, 1.0, eps))
    raw = ctypes.string_at(address, packer.size)
    assert raw[0] == 1
    assert struct.unpack_from("=Q", raw, 8)[0] == x.ptr
    assert struct.unpack_from("=I", raw, 16)[0] == n, f"seed={seed}"
    assert struct.unpack_from("=e", raw, 20)[0] == scale
    assert struct.unpack_from("=q", raw, 24)[0] == offset
    assert struct.unpack_from("=H", raw, 32)[0] == 0x3F80  # bf16(1.0)
    assert struct.unpack_from("=d", raw, 40)[0] == eps
    # numpy scalars and int->float promotion are accepted
    packer.pack((np.bool_(False), x, np.uint32(7), 2, np.int8(-3), np.float32(0.5), 1))
    assert packer.unpack()[2:] == (7, 2.0, -3, 0x3F00, 1.0)


def test_bf16_rounding_is_nearest_even(rng, seed):
    values = np.concatenate([rng.standard_normal(2000).astype(np.float32) * 100,
                             np.float32([0.0, -0.0, 1.0, 65504.0, 3e38, 1e-40])])
    for value in values:
        bits = f32_to_bf16_bits(float(value))
        rounded = np.uint32(bits << 16).view(np.float32)
        down = np.uint32((int(value.view(np.uint32)) >> 16) << 16).view(np.float32)
        up = np.uint32(((int(down.view(np.uint32)) >> 16) + 1) << 16).view(np.float32)
        best = min((abs(float(c) - float(value)), c) for c in (down, up))[0]
        assert abs(float(rounded) - float(value)) == best, f"{value} seed={seed}"
        if abs(float(down) - float(value)) == abs(float(up) - float(value)):
            assert bits % 2 == 0, f"tie must go to even: {value}"
    assert f32_to_bf16_bits(float("nan")) & 0x7FC0 == 0x7FC0
    assert f32_to_bf16_bits(float("inf")) == 0x7F80


def saxpy():
    return FakeCompiled("saxpy", [scalar("n", np.int32), scalar("a", np.float32),
                                  ptr("x", np.float32), ptr("y", np.float32)])


def expect_error(packer, args, *fragments):
    with pytest.raises(LaunchError) as info:
        packer.pack(args)
    message = str(info.value)
    for fragment in ("saxpy()",) + fragments:
        assert fragment in message, message
    return message


def test_argument_errors_name_kernel_parameter_expected_and_given():
    dev = FakeHostDevice()
    x, y = ar.zeros(4, np.float32, device=dev), ar.zeros(4, np.float32, device=dev)
    packer = ArgPacker(saxpy(), "cpu")
    expect_error(packer, (4, 2.0, x), "expects 4 runtime arguments", "n, a, x, y", "got 3")
    expect_error(packer, (4, 2.0, x, ar.zeros(4, np.float64, device=dev)),
                 "parameter 'y'", "float32 (Ptr[f32])", "Array of float64")
    expect_error(packer, (2**40, 2.0, x, y), "parameter 'n'", "[-2147483648, 2147483647]",
                 "int 1099511627776")
    expect_error(packer, (2.5, 2.0, x, y), "parameter 'n'", "an integer (i32)", "float 2.5")
    expect_error(packer, (4, "2", x, y), "parameter 'a'", "a float (f32)", "str '2'")
    expect_error(packer, (4, 1e300, x, y), "parameter 'a'", "fits f32")
    expect_error(packer, (4, 2.0, x, [1.0]), "parameter 'y'", "got list")
    expect_error(packer, (4, 2.0, x, np.zeros(8, np.float32)[::2]), "C-contiguous")


def test_unsigned_rejects_negative():
    kernel = FakeCompiled("saxpy", [scalar("n", np.uint32)])
    message = expect_error(ArgPacker(kernel, "cpu"), (-1,), "[0, 4294967295] (u32)", "int -1")
    assert "parameter 'n'" in message


def test_bool_parameter_is_strict():
    kernel = FakeCompiled("saxpy", [scalar("flag", np.bool_)])
    packer = ArgPacker(kernel, "cpu")
    packer.pack((1,))
    expect_error(packer, (2,), "a bool (bool_)", "int 2")


def test_cuda_kind_rejects_host_memory_with_hint():
    dev = FakeHostDevice()
    packer = ArgPacker(saxpy(), "cuda")
    x = ar.zeros(4, np.float32, device=dev)
    message = expect_error(packer, (4, 2.0, np.zeros(4, np.float32), x),
                           "parameter 'x' expects a cuda array of float32 (Ptr[f32])",
                           "got numpy.ndarray of float32", "pk.to_device(x)")
    assert "host memory" in message
    expect_error(packer, (4, 2.0, x, x), "parameter 'x'", "Array of float32 on cpu",
                 "runs on cuda")


def test_cuda_array_interface_objects_pass_their_pointer(rng):
    packer = ArgPacker(saxpy(), "cuda")
    address = int(rng.integers(1, 2**40)) * 256
    x = FakeCudaArray(address, (4,), "<f4")
    y = FakeCudaArray(address + 4096, (2, 2), "<f4", strides=(8, 4))
    packer.pack((4, 2.0, x, y))
    assert packer.unpack()[2:] == (address, address + 4096)
    assert packer.pointer_extents((4, 2.0, x, y))[2:] == [(address, 16), (address + 4096, 16)]
    expect_error(packer, (4, 2.0, x, FakeCudaArray(address, (4,), "<f8")), "float64")
    expect_error(packer, (4, 2.0, x, FakeCudaArray(address, (2, 2), "<f4", (4, 8))),
                 "C-contiguous")


def test_cpu_kind_accepts_numpy_and_dlpack(rng):
    packer = ArgPacker(saxpy(), "cpu")
    x = rng.standard_normal(5).astype(np.float32)
    y = np.zeros(5, np.float32)

    class DLPackOnly:  # e.g. a torch CPU tensor
        def __dlpack__(self, **kw):
            return y.__dlpack__(**kw)

    packer.pack((5, 1.5, x, DLPackOnly()))
    assert packer.unpack()[2:] == (x.ctypes.data, y.ctypes.data)
    assert packer.pointer_extents((5, 1.5, x, y)) == [None, None, (x.ctypes.data, 20),
                                                      (y.ctypes.data, 20)]
    expect_error(packer, (5, 1.5, x, np.zeros(5, np.int32)), "got numpy.ndarray of int32")


@pytest.mark.parametrize("dtype", INT_TYPES)
def test_integer_ranges(rng, seed, dtype):
    info = np.iinfo(dtype)
    kernel = FakeCompiled("saxpy", [scalar("k", dtype)])
    packer = ArgPacker(kernel, "cpu")
    for value in (int(info.min), int(info.max), int(rng.integers(info.min, info.max, dtype=dtype))):
        packer.pack((value,))
        assert packer.unpack() == (value,), f"{dtype} {value} seed={seed}"
    expect_error(packer, (int(info.max) + 1,), "parameter 'k'")
    expect_error(packer, (int(info.min) - 1,), "parameter 'k'")


def test_bfloat16_pointer_takes_uint16_storage():
    dev = FakeHostDevice()
    kernel = FakeCompiled("saxpy", [ptr("w", "bfloat16")])
    packer = ArgPacker(kernel, "cpu")
    w = ar.zeros(8, np.uint16, device=dev)
    packer.pack((w,))
    assert packer.unpack() == (w.ptr,)
    expect_error(packer, (ar.zeros(8, np.float16, device=dev),), "Ptr[bf16]")
