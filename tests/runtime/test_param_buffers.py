"""The parameter buffer a CUDA launch hands the driver, without a GPU: every field's bytes at
the offset the ABI gives it (each at its own alignment, awkward mixes of 1-, 2-, 4-, 8-byte
scalars, pointers and 128-byte tensor maps), read back as the driver reads them (through
`extra` or kernelParams); the generated launcher's pool buffers under concurrent launches;
and the load-time check of the packer's layout against the driver's."""
from __future__ import annotations

import ctypes
import re
import struct
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

import pykernel as pk
from pykernel.runtime.arrays import Array
from pykernel.runtime.packer import ArgPacker, f32_to_bf16_bits
from pykernel.runtime.param_buffers import (
    LAUNCH_PARAM_BUFFER_POINTER,
    LAUNCH_PARAM_BUFFER_SIZE,
    LAUNCH_PARAM_END,
    BufferPool,
    new_buffer,
    read_fields,
)
from pykernel.runtime.tensor_map import TiledTensorMap

cuda_runtime = pytest.importorskip("pykernel.runtime.cuda",
                                   reason="cuda-python is needed for the CUDA device class")
from pykernel.runtime import cuda_param_layout
from tests.runtime.fakes import FakeCompiled, ParamABI, mock_cuda_device, ptr, scalar

SCALARS = {"int8": "<b", "uint8": "<B", "int16": "<h", "uint16": "<H", "float16": "<e",
           "bfloat16": "<H", "int32": "<i", "uint32": "<I", "float32": "<f", "int64": "<q",
           "uint64": "<Q", "float64": "<d", "bool": "<B"}


def tensormap(name):
    return ParamABI(name, "tensormap", np.dtype(np.uint8), 128, 64, True)


def random_params(rng) -> list:
    """4-12 parameters of random kinds: small scalars land between pointers and maps."""
    kinds = list(SCALARS) + ["ptr", "ptr", "ptr", "tensormap"]
    params = []
    for index in range(int(rng.integers(4, 13))):
        kind = kinds[int(rng.integers(len(kinds)))]
        name = f"p{index}"
        params.append(ptr(name, np.float32) if kind == "ptr" else tensormap(name)
                      if kind == "tensormap" else scalar(name, kind))
    return params


def abi_offsets(params) -> tuple[list, int]:
    """Each field's offset in the device-side layout (aligned to the field's own alignment)
    and the end of the last one, computed here independently of the packer."""
    offsets, end = [], 0
    for param in params:
        end += (-end) % param.align
        offsets.append(end)
        end += param.size
    return offsets, end


def random_value(rng, param, device):
    """(argument, the bytes the kernel must receive for it)."""
    if param.kind == "ptr":
        array = Array(None, device.memory.alloc(64)[1], (16,), np.dtype(np.float32), device)
        return array, struct.pack("<Q", array.ptr)
    if param.kind == "tensormap":
        data = rng.integers(0, 256, 128, dtype=np.uint8).tobytes()
        return TiledTensorMap(data, "cuda", None, (8,), 0, "zeros"), data
    name = param.dtype if isinstance(param.dtype, str) else np.dtype(param.dtype).name
    if name == "bool":
        value = bool(rng.integers(2))
        return value, struct.pack("<B", value)
    if name in ("float16", "float32", "float64", "bfloat16"):
        value = float(np.float16(rng.standard_normal() * 100))    # exact in every float type
        if name == "bfloat16":
            return value, struct.pack("<H", f32_to_bf16_bits(value))
        return value, struct.pack(SCALARS[name], value)
    info = np.iinfo(np.dtype(name))
    value = int(rng.integers(info.min, info.max, endpoint=True, dtype=np.int64)
                if info.max < 2**63 else rng.integers(0, 2**63))
    return value, struct.pack(SCALARS[name], value)


class RecordingDriver:
    """cuLaunchKernel as the driver sees it: the bytes of each field, read during the call."""

    def __init__(self, params, delay: float = 0.0):
        self.offsets, _ = abi_offsets(params)
        self.sizes = [p.size for p in params]
        self.delay, self.seen, self.modes = delay, [], []

    def __call__(self, func, gx, gy, gz, bx, by, bz, shared, stream, kernel_params, extra):
        assert not (kernel_params and extra), "kernelParams and extra are exclusive"
        if self.delay:
            time.sleep(self.delay)          # lets another thread run (the real call drops the GIL)
        self.seen.append(read_fields(kernel_params, extra, self.offsets, self.sizes))
        self.modes.append("extra" if extra else "kernelParams" if kernel_params else "none")
        return (0,)


def test_layout_matches_the_abi_alignment(rng, seed):
    for _ in range(20):
        params = random_params(rng)
        packer = ArgPacker(FakeCompiled("mix", params), "cuda", 0)
        offsets, end = abi_offsets(params)
        assert (packer.offsets, packer.size) == (offsets, end), f"seed={seed} {params}"


@pytest.mark.parametrize("param_buffer", [True, False])
def test_fast_launch_hands_over_every_fields_bytes(monkeypatch, rng, seed, param_buffer):
    device = mock_cuda_device("sm_90", param_buffer=param_buffer)
    for trial in range(12):
        params = random_params(rng)
        compiled = FakeCompiled(f"mix{trial}", params)
        driver = RecordingDriver(params)
        monkeypatch.setattr(cuda_runtime, "_launch_kernel", driver)
        launch = device.fast_launch(compiled, (2, 1, 1), (32, 1, 1), fallback=None)
        expected = []
        for _ in range(3):               # the pool's buffer is reused: each call its own bytes
            values = [random_value(rng, p, device) for p in params]
            launch(*(v for v, _ in values))
            expected.append([b for _, b in values])
        assert driver.seen == expected, f"seed={seed} params={params}"
        assert driver.modes == ["extra" if param_buffer else "kernelParams"] * 3


def test_full_path_and_bound_launch_use_the_same_layout(monkeypatch, rng, seed):
    device = mock_cuda_device("sm_90")
    params = [scalar("a", "int8"), ptr("x", np.float32), scalar("h", "float16"),
              scalar("b", "bfloat16"), ptr("y", np.float32), scalar("c", "uint16"),
              tensormap("m"), scalar("d", "float64"), scalar("e", "bool")]
    compiled = FakeCompiled("awkward", params)
    driver = RecordingDriver(params)
    monkeypatch.setattr(cuda_runtime, "_launch_kernel", driver)
    values = [random_value(rng, p, device) for p in params]
    args = tuple(v for v, _ in values)
    device.launch(compiled, (1, 1, 1), (64, 1, 1), args)
    bound = device.bind(compiled, (1, 1, 1), (64, 1, 1), args)
    device.launch(compiled, (1, 1, 1), (64, 1, 1),
                  tuple(v for v, _ in (random_value(rng, p, device) for p in params)))
    bound()                               # its own copy, whatever was packed since
    expected = [b for _, b in values]
    assert driver.seen[0] == expected and driver.seen[2] == expected, f"seed={seed}"
    assert driver.modes == ["extra"] * 3


def test_kernel_without_parameters_passes_null():
    device = mock_cuda_device("sm_90")
    calls = []
    original = cuda_runtime._launch_kernel
    cuda_runtime._launch_kernel = lambda *a: calls.append(a[-2:]) or (0,)
    try:
        launch = device.fast_launch(FakeCompiled("empty", []), (1, 1, 1), (1, 1, 1))
        launch()
        device.launch(FakeCompiled("empty", []), (1, 1, 1), (1, 1, 1), ())
    finally:
        cuda_runtime._launch_kernel = original
    assert calls == [(0, 0), (0, 0)]


@pytest.mark.parametrize("path", ["fast", "full"])
def test_concurrent_launches_never_share_a_buffer(monkeypatch, rng, seed, path):
    """Threads launching one kernel at once, through the generated launcher (pool buffers) or
    the full path (the shared buffer, under the kernel's lock): the driver stand-in sleeps
    before reading the buffer (as the real call releases the GIL), so a buffer shared without
    care would show another thread's values."""
    device = mock_cuda_device("sm_90")
    params = [ptr("x", np.float32), scalar("n", "int32"), scalar("s", "float32")]
    compiled = FakeCompiled("racy", params)
    driver = RecordingDriver(params, delay=0.001)
    monkeypatch.setattr(cuda_runtime, "_launch_kernel", driver)
    launch = device.fast_launch(compiled, (1, 1, 1), (32, 1, 1)) if path == "fast" else \
        (lambda *args: device.launch(compiled, (1, 1, 1), (32, 1, 1), args))
    x = Array(None, device.memory.alloc(64)[1], (16,), np.dtype(np.float32), device)
    counts = rng.integers(0, 2**31 - 1, size=(4, 25))
    errors = []

    def worker(row):
        try:
            for n in counts[row]:
                launch(x, int(n), float(row))
        except Exception as exc:       # reported below: a thread's exception is otherwise lost
            errors.append(exc)
    threads = [threading.Thread(target=worker, args=(row,)) for row in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    seen = sorted((struct.unpack("<i", n)[0], struct.unpack("<f", s)[0])
                  for _, n, s in driver.seen)
    expected = sorted((int(n), float(row)) for row in range(4) for n in counts[row])
    assert seen == expected, f"seed={seed}"
    if path == "fast":
        assert len(device._kernels[compiled.cache_key].packer.pool.free) >= 2, \
            "the threads overlapped: the pool made buffers of its own for them"


def test_extra_array_is_what_cuda_h_defines():
    from cuda.bindings import driver as cu
    assert (LAUNCH_PARAM_END, LAUNCH_PARAM_BUFFER_POINTER, LAUNCH_PARAM_BUFFER_SIZE) == (
        int(cu.CU_LAUNCH_PARAM_END), int(cu.CU_LAUNCH_PARAM_BUFFER_POINTER),
        int(cu.CU_LAUNCH_PARAM_BUFFER_SIZE))
    storage, base, params, extra = new_buffer([0, 8, 12], 14)
    words = (ctypes.c_void_p * 5).from_address(extra)
    start = ctypes.addressof(storage) + base
    assert (words[0], words[1], words[2], words[4]) == (1, start, 2, None)
    assert ctypes.c_size_t.from_address(words[3]).value == 14 and start % 16 == 0
    pointers = (ctypes.c_void_p * 3).from_address(params)
    assert list(pointers) == [start, start + 8, start + 12]
    pool = BufferPool([0], 4)
    first = pool.take()
    with pytest.raises(IndexError):
        pool.take()                   # empty: the launcher then makes one (pool.new)
    pool.give(first)
    assert pool.take() is first


def fake_driver(layout):
    """cuda.bindings.driver with cuFuncGetParamInfo answering from `layout` ([(offset,
    size)]; None: the driver does not support the query)."""
    from cuda.bindings import driver as cu
    invalid, unsupported = cu.CUresult.CUDA_ERROR_INVALID_VALUE, \
        cu.CUresult.CUDA_ERROR_NOT_SUPPORTED

    def query(func, index):
        if layout is None:
            return unsupported, 0, 0
        return (cu.CUresult.CUDA_SUCCESS, *layout[index]) if index < len(layout) else \
            (invalid, 0, 0)
    return SimpleNamespace(cuFuncGetParamInfo=query, CUresult=cu.CUresult)


def test_layout_check_against_the_driver(monkeypatch):
    params = [scalar("a", "int8"), ptr("x", np.float32), scalar("h", "float16"), tensormap("m")]
    packer = ArgPacker(FakeCompiled("k", params), "cuda", 0)
    right = [(0, 1), (8, 8), (16, 2), (64, 128)]
    monkeypatch.setattr(cuda_param_layout, "cu", fake_driver(right))
    assert cuda_param_layout.buffer_layout_ok(None, packer)
    monkeypatch.setattr(cuda_param_layout, "cu", fake_driver(None))
    assert not cuda_param_layout.buffer_layout_ok(None, packer), "unsupported: kernelParams"
    for wrong, message in (([(0, 1), (4, 8), (16, 2), (64, 128)],
                            (r"parameter 1 \('x'\) is 8 bytes at offset 4 for the driver, "
                             r"8 at 8")),
                           (right[:3], "the driver knows 3 parameters, pykernel packs 4"),
                           (right + [(192, 4)], "the driver knows more than the 4")):
        monkeypatch.setattr(cuda_param_layout, "cu", fake_driver(wrong))
        assert not cuda_param_layout.buffer_layout_ok(None, packer), "differs: kernelParams"
        assert re.fullmatch(message + ".*", cuda_param_layout.layout_difference(None, packer))


# --- a compiled kernel with an awkward parameter mix, run on a device -------------------------

@pk.kernel
def mixed(a: pk.i8, x: pk.Ptr[pk.f32], h: pk.f16, b: pk.i16, d: pk.f64, out: pk.Ptr[pk.f32],
          n: pk.i32, flag: pk.bool_, u: pk.u8):
    """Every scalar lands in the output, so a field read from a wrong offset shows."""
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        v = x[i] * pk.f32(h) + pk.f32(a) + pk.f32(b) + pk.f32(d) + pk.f32(u)
        if flag:
            v = v + 1000.0
        out[i] = v


def mixed_args(rng, device):
    """(arguments, host x, out array, the expected output) with fresh random values; the
    scalars are exact in f32 so the expected output is the kernel's f32 arithmetic."""
    n = int(rng.integers(100, 3000))
    hx = rng.standard_normal(n).astype(np.float32)
    a, b, u = int(rng.integers(-128, 128)), int(rng.integers(-2**15, 2**15)), \
        int(rng.integers(0, 256))
    h, d = float(np.float16(rng.standard_normal())), float(rng.integers(-1000, 1000)) / 8
    flag = bool(rng.integers(2))
    x = pk.to_device(hx, device=device)
    out = pk.to_device(np.full(n, np.nan, np.float32), device=device)
    f32 = np.float32
    expected = (hx * f32(h) + f32(a) + f32(b) + f32(d) + f32(u)).astype(f32)
    if flag:
        expected = expected + f32(1000.0)
    return (a, x, h, b, d, out, n, flag, u), out, expected


def check_mixed_launches(device, rng, seed, launches: int = 4):
    for _ in range(launches):      # the first two on the full path, then the generated one
        args, out, expected = mixed_args(rng, device)
        mixed[-(-args[6] // 128), 128](*args)
        device.synchronize()
        np.testing.assert_array_equal(out.numpy(), expected, err_msg=f"seed={seed}")


def test_mixed_parameters_on_the_cpu_target(cpu_device, rng, seed):
    check_mixed_launches(cpu_device, rng, seed)


@pytest.mark.gpu
def test_mixed_parameters_as_one_buffer_on_a_gpu(rng, seed):
    """On a real GPU: the driver confirms the packer's layout (cuFuncGetParamInfo), the
    parameters go through `extra`, and the kernel sees every field: through the full path,
    the generated launcher, a bound launch, and from four threads at once."""
    from pykernel.runtime import device as devices
    if not devices.gpu_available():
        pytest.skip("no usable CUDA GPU (driver missing or no device)")
    saved = devices._current
    gpu = pk.set_device("cuda")
    try:
        check_mixed_launches(gpu, rng, seed)
        loaded = [k for k in gpu._kernels.values() if k.name == "mixed"]
        assert loaded and all(k.param_buffer and k.extra and not k.kernel_params
                              for k in loaded), "the driver confirmed the layout: extra"
        args, out, expected = mixed_args(rng, gpu)
        bound = mixed[-(-args[6] // 128), 128].bind(*args)    # packed now, not launched
        check_mixed_launches(gpu, rng, seed, 1)       # other values packed meanwhile
        bound.launch()
        gpu.synchronize()
        np.testing.assert_array_equal(out.numpy(), expected, err_msg=f"seed={seed}")
        jobs = [mixed_args(np.random.default_rng(seed + k), gpu) for k in range(4)]

        def worker(job):
            args = job[0]
            for _ in range(20):
                mixed[-(-args[6] // 128), 128](*args)
        threads = [threading.Thread(target=worker, args=(job,)) for job in jobs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        gpu.synchronize()
        for _, out, expected in jobs:
            np.testing.assert_array_equal(out.numpy(), expected, err_msg=f"seed={seed}")
    finally:
        devices._current = saved
