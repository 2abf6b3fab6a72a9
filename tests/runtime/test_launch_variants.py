"""The launch path without a GPU: which compiled variant a launch loads (the PDL prologue only
where a launch asks for programmatic dependent launch), bound launches, and the CUDA device's
whole launch path with the final driver call replaced (cuLaunchKernel mocked)."""
from __future__ import annotations

import struct

import numpy as np
import pytest

import pykernel as pk
from pykernel import compile_pool
from pykernel.errors import LaunchError
from pykernel.runtime.device import get_device
from pykernel.runtime.param_buffers import read_fields

cuda_runtime = pytest.importorskip("pykernel.runtime.cuda",
                                   reason="cuda-python is needed for the CUDA device class")
from tests.runtime.fakes import mock_cuda_device  # noqa: E402


@pk.kernel
def add(x: pk.Ptr[pk.f32], y: pk.Ptr[pk.f32], out: pk.Ptr[pk.f32], n: pk.i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        out[i] = x[i] + y[i]


class DriverCalls:
    """Stands in for cuLaunchKernel: records each call's function, geometry and the runtime
    values handed over (pointers as u64, scalars as i32), read during the call as the driver
    does: through kernelParams, or from the one buffer in `extra` at the offsets the ABI
    gives (each field at its own alignment); exactly one of the two may be set."""

    def __init__(self, params):
        self.calls, self.params = [], params
        self.formats = ["<Q" if p.kind == "ptr" else "<i" for p in params]
        sizes = [struct.calcsize(f) for f in self.formats]
        self.offsets, end = [], 0
        for size in sizes:          # pointers and i32: the alignment is the size
            end += (-end) % size
            self.offsets.append(end)
            end += size
        self.sizes, self.modes = sizes, []

    def __call__(self, func, gx, gy, gz, bx, by, bz, shared, stream, kernel_params, extra):
        assert not (kernel_params and extra), "the driver takes kernelParams or extra, not both"
        fields = read_fields(kernel_params, extra, self.offsets, self.sizes)
        values = tuple(struct.unpack(f, b)[0] for f, b in zip(self.formats, fields))
        self.modes.append("extra" if extra else "kernelParams")
        self.calls.append(((gx, gy, gz), (bx, by, bz), shared, values))
        return (0,)

    def ex(self, config, func, kernel_params, extra):
        """cuLaunchKernelEx (PDL, clusters): the same record, plus its attributes' ids."""
        self(func, config.gridDimX, config.gridDimY, config.gridDimZ, config.blockDimX,
             config.blockDimY, config.blockDimZ, config.sharedMemBytes, config.hStream,
             kernel_params, extra)
        self.calls[-1] += (tuple(int(a.id) for a in config.attrs[:config.numAttrs]),)
        return (0,)


@pytest.fixture
def gpu(monkeypatch):
    """A mocked sm_90 CudaDevice as the current device; its loads are recorded."""
    device = mock_cuda_device("sm_90")
    loaded = []
    load = device.load
    device.load = lambda compiled: loaded.append(compiled) or load(compiled)
    calls = DriverCalls(add.runtime_params)
    monkeypatch.setattr(cuda_runtime, "_launch_kernel", calls)
    monkeypatch.setattr(cuda_runtime, "_launch_kernel_ex", calls.ex)
    saved = pk.runtime.device._current
    pk.set_device(device)
    yield device, loaded, calls
    pk.runtime.device._current = saved


def arrays(device, n):
    return [pk.runtime.arrays.Array(None, device.memory.alloc(4 * n)[1], (n,),
                                    np.dtype(np.float32), device) for _ in range(3)]


def test_plain_launch_loads_the_variant_without_pdl_prologue(gpu):
    device, loaded, calls = gpu
    x, y, out = arrays(device, 1000)
    add[4, 256](x, y, out, 1000)
    add[4, 256](x, y, out, 1000)
    assert len(loaded) == 1 and "griddepcontrol" not in loaded[0].ptx
    assert "pdl" not in loaded[0].uses
    with pk.programmatic_launches(device):
        add[4, 256](x, y, out, 1000)
    assert len(loaded) == 2, "a PDL launch loads its own variant"
    pdl_attribute = int(cuda_runtime.cu.CUlaunchAttributeID
                        .CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
    assert calls.calls[-1][4] == (pdl_attribute,), "launched with the PDL attribute"
    assert "griddepcontrol.wait" in loaded[1].ptx
    assert "griddepcontrol.launch_dependents" in loaded[1].ptx
    assert loaded[0].cache_key != loaded[1].cache_key
    add[4, 256](x, y, out, 1000)          # back to plain: the first variant, already loaded
    assert len(loaded) == 2 and len(calls.calls) == 4
    assert calls.calls[0] == ((4, 1, 1), (256, 1, 1), 0, (x.ptr, y.ptr, out.ptr, 1000))


def test_variant_options_per_arch():
    plain = add.launch_options("sm_90", programmatic=False)
    assert plain.pdl is False and add.launch_options("sm_90", True) is add.options
    for arch in ("cpu", "sm_80", "sm_75"):        # no prologue there: one variant
        assert add.launch_options(arch, False) is add.options
    no_pdl = pk.kernel(pdl=False)(add.fn)
    assert no_pdl.launch_options("sm_100", True) is no_pdl.options


def test_precompile_records_the_variant_the_launch_loads(gpu):
    device, loaded, _ = gpu
    x, y, out = arrays(device, 64)
    with compile_pool.recorded_launches() as jobs:
        add[1, 64](x, y, out, 64)
        with pk.programmatic_launches(device):
            add[1, 64](x, y, out, 64)
    assert [options.pdl for _, _, _, options in jobs] == [False, True]
    assert not loaded, "a recorded launch is not made"


def test_bound_launch_keeps_its_own_parameters(gpu):
    device, _, calls = gpu
    x, y, out = arrays(device, 512)
    a, b, c = arrays(device, 512)
    bound = add[2, 256].bind(x, y, out, 500)
    add[2, 256](a, b, c, 17)                       # overwrites the kernel's shared buffer
    bound.launch()
    bound.launch()
    assert [call[3] for call in calls.calls] == [(a.ptr, b.ptr, c.ptr, 17)] + \
        [(x.ptr, y.ptr, out.ptr, 500)] * 2
    with pytest.raises(LaunchError, match=r"add\(\): parameter 'y' expects .*float32.* got "
                                          r"Array of int32"):
        add[2, 256].bind(x, pk.runtime.arrays.Array(None, y.ptr, (512,), np.dtype(np.int32),
                                                    device), out, 500)


def test_bound_launch_follows_the_launch_mode(gpu):
    device, loaded, calls = gpu
    x, y, out = arrays(device, 64)
    bound = add[1, 64].bind(x, y, out, 64)
    with pk.programmatic_launches(device):      # goes through the full path: PDL variant
        bound.launch()
    assert len(loaded) == 2 and "griddepcontrol" in loaded[1].ptx


def test_cuda_array_interface_and_errors_through_the_launch(gpu):
    device, _, calls = gpu

    class Foreign:
        def __init__(self, ptr, typestr="<f4", strides=None):
            self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (8,),
                                             "typestr": typestr, "strides": strides,
                                             "version": 3}
    add[1, 8](Foreign(4096), Foreign(8192), Foreign(12288), 8)
    assert calls.calls[-1][3] == (4096, 8192, 12288, 8)
    with pytest.raises(LaunchError, match=r"add\(\): parameter 'y' expects a cuda array of "
                                          r"float32 .*element type is float64"):
        add[1, 8](Foreign(4096), Foreign(8192, "<f8"), Foreign(12288), 8)
    with pytest.raises(LaunchError, match="parameter 'out' expects C-contiguous"):
        add[1, 8](Foreign(4096), Foreign(8192), Foreign(12288, strides=(8,)), 8)


def test_bound_launch_on_the_cpu_target_runs_with_current_contents(rng, seed):
    cpu = get_device("cpu")
    n = 1000 + int(rng.integers(0, 100))
    x = pk.to_device(rng.standard_normal(n).astype(np.float32), device=cpu)
    y = pk.to_device(rng.standard_normal(n).astype(np.float32), device=cpu)
    out = pk.to_device(np.full(n, np.nan, np.float32), device=cpu)
    saved = pk.runtime.device._current
    pk.set_device(cpu)
    try:
        bound = add[-(-n // 128), 128].bind(x, y, out, n)
        bound.launch()
        np.testing.assert_array_equal(out.numpy(), x.numpy() + y.numpy(), f"seed={seed}")
        x.copy_from(np.ones(n, np.float32))
        bound.launch()
        np.testing.assert_array_equal(out.numpy(), 1 + y.numpy(), f"seed={seed}")
    finally:
        pk.runtime.device._current = saved


def test_both_variants_run_on_the_cpu_target(rng, seed):
    """The plain and the PDL variant's options compile and compute the same sums on the CPU
    target (where neither emits a prologue)."""
    cpu = get_device("cpu")
    n = 300 + int(rng.integers(0, 50))
    x = pk.to_device(rng.standard_normal(n).astype(np.float32), device=cpu)
    y = pk.to_device(rng.standard_normal(n).astype(np.float32), device=cpu)
    for options in (add.launch_options("sm_90", False), add.launch_options("sm_90", True)):
        out = pk.to_device(np.full(n, np.nan, np.float32), device=cpu)
        compiled = add.compile("cpu", options)
        cpu.launch(compiled, (-(-n // 64), 1, 1), (64, 1, 1), (x, y, out, n))
        np.testing.assert_array_equal(out.numpy(), x.numpy() + y.numpy(),
                                      f"pdl={options.pdl} seed={seed}")


def test_a_thread_without_the_context_current_launches_after_one_retry(gpu, monkeypatch):
    """A thread other than the device's creator has no (or another) context current: its
    first launch fails with CUDA_ERROR_INVALID_CONTEXT, the device makes its context current
    and launches again, on the generated fast path, the full path and a bound launch alike;
    any other error is not retried."""
    device, _, calls = gpu
    invalid = cuda_runtime.cu.CUresult.CUDA_ERROR_INVALID_CONTEXT
    state = {"current": 0, "set": []}
    monkeypatch.setattr(device, "_context", 0x5EED, raising=False)   # the mock has none
    monkeypatch.setattr(cuda_runtime.cu, "cuCtxGetCurrent",
                        lambda: (cuda_runtime.cu.CUresult.CUDA_SUCCESS, state["current"]))

    def set_current(context):
        state["current"] = int(context)
        state["set"].append(int(context))
        return (cuda_runtime.cu.CUresult.CUDA_SUCCESS,)
    monkeypatch.setattr(cuda_runtime.cu, "cuCtxSetCurrent", set_current)

    def driver(*args):
        if state["current"] != int(device._context):
            return (invalid,)
        return calls(*args)
    monkeypatch.setattr(cuda_runtime, "_launch_kernel", driver)
    x, y, out = arrays(device, 256)
    launches = [lambda: add[1, 256](x, y, out, 256),            # first call: full path
                lambda: add[1, 256](x, y, out, 256),            # then the generated launcher
                add[1, 256].bind(x, y, out, 256).launch]
    for launch in launches:
        state["current"] = 0                     # as on a fresh thread
        launch()
    assert len(calls.calls) == 3 and state["set"] == [int(device._context)] * 3
    # not retried: another error, or an invalid context while ours is already current
    state["current"] = 0
    assert not device.reactivated(cuda_runtime.cu.CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)
    state["current"] = int(device._context)
    assert not device.reactivated(invalid)
