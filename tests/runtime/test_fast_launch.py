"""The launcher's fast path without a GPU (cuLaunchKernel mocked): after two plain calls, a
`kernel[grid, block](...)` goes through the device's fused check-pack-launch function, with the
same results and the same errors as the full path, and the full path again whenever the launch
mode or the current device changes; torch tensors take the packer's inline branch once seen."""
from __future__ import annotations

import numpy as np
import pytest

import pykernel as pk
from pykernel import compile_pool
from pykernel.errors import LaunchError
from pykernel.launch import Launcher
from pykernel.runtime.packer import ArgPacker

cuda_runtime = pytest.importorskip("pykernel.runtime.cuda",
                                   reason="cuda-python is needed for the CUDA device class")
from tests.runtime.fakes import (arrays, mock_cuda_device, scale_kernel,  # noqa: E402
                                 torch_scale_args)
from tests.runtime.test_launch_variants import DriverCalls, add  # noqa: E402


@pytest.fixture
def gpu(monkeypatch):
    """A mocked sm_90 CudaDevice as the current device; full-path calls are counted."""
    device = mock_cuda_device("sm_90")
    calls = DriverCalls(add.runtime_params)
    monkeypatch.setattr(cuda_runtime, "_launch_kernel", calls)
    monkeypatch.setattr(cuda_runtime, "_launch_kernel_ex", calls.ex)
    full = []
    call = Launcher._call
    monkeypatch.setattr(Launcher, "_call",
                        lambda self, *a, **k: full.append(a) or call(self, *a, **k))
    add._launchers.clear()        # launchers made from here on count their full-path calls
    saved = pk.runtime.device._current
    pk.set_device(device)
    yield device, calls, full
    pk.runtime.device._current = saved
    add._launchers.clear()


def test_repeated_calls_take_the_fast_path_with_their_own_arguments(gpu, rng, seed):
    device, calls, full = gpu
    sizes = [int(rng.integers(1, 5000)) for _ in range(4)]
    launched = []
    for n in sizes:
        x, y, out = arrays(device, n)
        add[7, 96](x, y, out, n)
        launched.append(((7, 1, 1), (96, 1, 1), 0, (x.ptr, y.ptr, out.ptr, n)))
    assert calls.calls == launched, f"seed={seed}"
    assert len(full) == 2, "only the first two calls take the full path"
    assert device._recent[-1] == "add" and len(device._recent) == len(sizes)


def warm(launcher, *args):
    """Two plain calls: the launcher then holds its device's fast function."""
    launcher(*args)
    launcher(*args)
    assert launcher.func.__name__ == "launch", "the generated fast function is in place"


def test_fast_path_errors_read_as_the_full_paths(gpu):
    device, calls, _ = gpu
    x, y, out = arrays(device, 64)
    warm(add[1, 64], x, y, out, 64)
    wrong = arrays(device, 64, np.int32)[0]
    with pytest.raises(LaunchError, match=r"add\(\): parameter 'y' expects .*float32.* got "
                                          r"Array of int32"):
        add[1, 64](x, wrong, out, 64)
    with pytest.raises(LaunchError, match=r"add\(\): missing argument\(s\) n"):
        add[1, 64](x, y, out)
    with pytest.raises(LaunchError, match=r"add\(\): takes 4 arguments \(x, y, out, n\), got 5"):
        add[1, 64](x, y, out, 64, 64)
    with pytest.raises(LaunchError, match=r"parameter 'n' expects an integer"):
        add[1, 64](x, y, out, True)
    with pytest.raises(LaunchError, match=r"parameter 'n'"):
        add[1, 64](x, y, out, 2**40)
    with pytest.raises(LaunchError, match=r"pk.to_device"):
        add[1, 64](x, np.zeros(64, np.float32), out, 64)
    assert len(calls.calls) == 2, "a refused launch reaches no driver call"


def test_mode_changes_go_through_the_full_path(gpu, monkeypatch):
    device, calls, full = gpu
    x, y, out = arrays(device, 128)
    launcher = add[1, 128]
    warm(launcher, x, y, out, 128)
    with pk.programmatic_launches(device):      # the PDL variant, with the PDL attribute
        launcher(x, y, out, 128)
    pdl = int(cuda_runtime.cu.CUlaunchAttributeID
              .CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
    assert calls.calls[-1][4] == (pdl,) and len(full) == 3
    synchronized = []
    monkeypatch.setattr(device, "_synchronize_after",
                        lambda kernel, handle: synchronized.append(kernel.name))
    device.sync_launches = True
    launcher(x, y, out, 128)
    device.sync_launches = False
    assert synchronized == ["add"] and len(full) == 4
    with compile_pool.recorded_launches() as jobs:
        launcher(x, y, out, 128)
    assert len(jobs) == 1 and len(calls.calls) == 4, "a recorded launch is not made"
    launcher(x, y, out, 128)
    assert len(full) == 5 and len(calls.calls) == 5, "back on the fast path"


def test_a_capture_records_through_the_full_path(gpu):
    device, _, full = gpu
    x, y, out = arrays(device, 32)
    warm(add[1, 32], x, y, out, 32)

    class Recorder:
        def __init__(self):
            self.launches = []

        def record(self, kernel, grid, block, shared_bytes, handle, args, cluster):
            self.launches.append((kernel.name, grid, args))
    device._capture = recorder = Recorder()
    try:
        add[1, 32](x, y, out, 16)
    finally:
        device._capture = None
    assert recorder.launches == [("add", (1, 1, 1), (x, y, out, 16))] and len(full) == 3


def test_another_current_device_gets_the_launch(gpu):
    device, calls, full = gpu
    x, y, out = arrays(device, 32)
    warm(add[1, 32], x, y, out, 32)
    other = mock_cuda_device("sm_90")
    pk.set_device(other)
    a, b, c = arrays(other, 32)
    add[1, 32](a, b, c, 32)
    assert len(full) == 3 and other._kernels, "launched through the new current device"
    assert list(other._recent) == ["add"]
    warm(add[1, 32], a, b, c, 16)
    add[1, 32](a, b, c, 8)
    assert len(full) == 4 and calls.calls[-1][3] == (a.ptr, b.ptr, c.ptr, 8)
    pk.set_device(device)                      # back: its fast function is kept
    add[1, 32](x, y, out, 4)
    add[1, 32](x, y, out, 2)
    assert len(full) == 5 and calls.calls[-1][3] == (x.ptr, y.ptr, out.ptr, 2)


def test_torch_tensors_take_the_inline_branch_once_seen(rng, seed):
    torch = pytest.importorskip("torch")
    packer = ArgPacker(scale_kernel(), "cpu")
    x, w, n = torch_scale_args(torch, rng)
    packer.pack((x, w, n))                   # first sight: the converter, then the binding
    assert all(scope["Tensor"] is torch.Tensor for scope in packer._scopes)
    for view in (x, x[1:], x[2:5]):
        packer.pack((view, w, n))
        assert packer.unpack() == (view.data_ptr(), w.data_ptr(), n), f"seed={seed}"
    parameter = torch.nn.Parameter(x.clone())          # a subclass: the converter's path
    packer.pack((parameter, w, n))
    assert packer.unpack()[0] == parameter.data_ptr()
    for bad, message in ((x.double(), "element type is float64"),
                         (x[::2], "parameter 'x' expects C-contiguous"),
                         (w, "element type is bfloat16")):
        with pytest.raises(LaunchError, match=message):
            packer.pack((bad, w, n))


def test_torch_host_tensors_stay_refused_by_the_cuda_kind():
    torch = pytest.importorskip("torch")
    packer = ArgPacker(scale_kernel(), "cuda", 0)
    x, w = torch.zeros(4), torch.zeros(4, dtype=torch.bfloat16)
    for _ in range(2):                       # before and after the inline branch is bound
        with pytest.raises(LaunchError, match="parameter 'x' expects a cuda array of "
                                              "float32.*it is on cpu"):
            packer.pack((x, w, 4))


def test_torch_cuda_tensor_stand_in_through_the_cuda_kind():
    """A torch.Tensor subclass that reports a CUDA device and address (what the converter's
    torch path reads), since a real CUDA tensor needs a GPU."""
    torch = pytest.importorskip("torch")

    class OnCuda(torch.Tensor):
        def get_device(self):
            return 0

        def data_ptr(self):
            return 0x7000_0000

    packer = ArgPacker(scale_kernel(), "cuda", 0)
    x = torch.zeros(4).as_subclass(OnCuda)
    w = torch.zeros(4, dtype=torch.bfloat16).as_subclass(OnCuda)
    packer.pack((x, w, 4))
    assert packer.unpack() == (0x7000_0000, 0x7000_0000, 4)


@pytest.mark.gpu
def test_torch_cuda_tensors_through_the_fast_path_on_a_gpu(rng, seed):
    """On a real GPU: torch CUDA tensors through the launcher's generated function (the inline
    torch branch from the third call on), results checked, refusals still precise."""
    torch = pytest.importorskip("torch")
    from pykernel.runtime import device as devices
    if not devices.gpu_available() or not torch.cuda.is_available():
        pytest.skip("no usable CUDA GPU (driver missing or no device)")
    saved = devices._current
    pk.set_device("cuda")
    try:
        n = int(rng.integers(1000, 5000))
        launcher = add[-(-n // 256), 256]
        for _ in range(4):
            hx, hy = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
            x, y = torch.from_numpy(hx).cuda(), torch.from_numpy(hy).cuda()
            out = torch.full((n,), float("nan"), device="cuda")
            launcher(x, y, out, n)
            torch.cuda.synchronize()
            np.testing.assert_array_equal(out.cpu().numpy(), hx + hy, err_msg=f"seed={seed}")
        assert launcher.func.__name__ == "launch"
        with pytest.raises(LaunchError, match="parameter 'x' expects C-contiguous"):
            launcher(torch.zeros(2 * n, device="cuda")[::2], y, out, n)
        with pytest.raises(LaunchError, match="element type is float64"):
            launcher(x.double(), y, out, n)
        with pytest.raises(LaunchError, match="it is on cpu"):
            launcher(x.cpu(), y, out, n)
    finally:
        devices._current = saved
