"""Array arguments of other libraries: torch tensors (skipped without torch), CuPy arrays (a
stand-in module: the attributes CuPy documents), decided once per type; errors name kernel,
parameter, expected and given."""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from pykernel.errors import LaunchError
from pykernel.runtime import pointer_sources
from pykernel.runtime.packer import ArgPacker
from tests.runtime.fakes import scale_kernel, torch_scale_args


def expect_error(packer, args, *fragments):
    with pytest.raises(LaunchError) as info:
        packer.pack(args)
    for fragment in ("scale()",) + fragments:
        assert fragment in str(info.value), str(info.value)


def test_torch_tensors_on_the_cpu_kind(rng, seed):
    torch = pytest.importorskip("torch")
    packer = ArgPacker(scale_kernel(), "cpu")
    x, w, n = torch_scale_args(torch, rng)
    packer.pack((x, w, n))
    packer.pack((x[1:], w.view(torch.uint16), n - 1))      # an offset view; bf16 as u16 bits
    assert packer.unpack() == (x.data_ptr() + 4, w.data_ptr(), n - 1), f"seed={seed}"
    assert packer.pointer_extents((x, w, n))[:2] == [(x.data_ptr(), 4 * n),
                                                     (w.data_ptr(), 2 * n)]
    expect_error(packer, (x.double(), w, n), "parameter 'x'", "float32 (Ptr[f32])",
                 "element type is float64")
    expect_error(packer, (x, w.float(), n), "parameter 'w'", "Ptr[bf16]",
                 "element type is float32")
    expect_error(packer, (x[::2], w, n), "parameter 'x' expects C-contiguous",
                 "pass a contiguous copy")
    assert pointer_sources.source_of(type(x)) is pointer_sources.TORCH


def test_torch_host_tensor_for_the_cuda_kind_says_where_it_is():
    torch = pytest.importorskip("torch")
    packer = ArgPacker(scale_kernel(), "cuda", 0)
    x, w = torch.zeros(4), torch.zeros(4, dtype=torch.bfloat16)
    expect_error(packer, (x, w, 4), "parameter 'x' expects a cuda array of float32",
                 "torch.Tensor", "it is on cpu")


@pytest.fixture
def fake_cupy(monkeypatch):
    """A module named cupy whose ndarray has what CuPy documents: data.ptr (with the offset),
    dtype, flags.c_contiguous, device.id, nbytes."""
    module = types.ModuleType("cupy")

    class ndarray:
        def __init__(self, address, n, dtype, contiguous=True, device=0):
            self.data = types.SimpleNamespace(ptr=address)
            self.dtype, self.nbytes = np.dtype(dtype), n * np.dtype(dtype).itemsize
            self.flags = types.SimpleNamespace(c_contiguous=contiguous)
            self.device = types.SimpleNamespace(id=device)
    module.ndarray = ndarray
    monkeypatch.setitem(sys.modules, "cupy", module)
    yield module
    pointer_sources._BY_TYPE.pop(ndarray, None)


def test_cupy_arrays_on_the_cuda_kind(fake_cupy, rng):
    packer = ArgPacker(scale_kernel(), "cuda", 0)
    address = int(rng.integers(1, 2**30)) * 256
    x, w = fake_cupy.ndarray(address, 8, np.float32), fake_cupy.ndarray(address + 64, 8,
                                                                         np.uint16)
    packer.pack((x, w, 8))
    assert packer.unpack() == (address, address + 64, 8)
    expect_error(packer, (fake_cupy.ndarray(address, 8, np.int32), w, 8), "parameter 'x'",
                 "element type is int32")
    expect_error(packer, (fake_cupy.ndarray(address, 8, np.float32, False), w, 8),
                 "C-contiguous")
    expect_error(packer, (fake_cupy.ndarray(address, 8, np.float32, device=1), w, 8),
                 "an array on cuda:0", "this array is on cuda:1")


def test_anything_else_is_named_in_the_error():
    packer = ArgPacker(scale_kernel(), "cuda", 0)
    expect_error(packer, ("x", None, 1), "parameter 'x' expects a cuda array of float32",
                 "got str 'x'")
    expect_error(packer, (object(), None, 1), "got object")
