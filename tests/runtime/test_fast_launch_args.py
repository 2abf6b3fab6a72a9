"""The launcher's generated function and the arguments it is given, without a GPU
(cuLaunchKernel mocked): keywords and wrong counts leave it for the full path, another GPU's
array is refused as the full path refuses it, and torch tensors take its inline branch (CPU
tensors on a mocked CUDA device numbered -1, torch's number for host memory, so that they
read as this device's) with the same refusals, word for word, as a fresh launcher's full
path."""
from __future__ import annotations

import numpy as np
import pytest

import pykernel as pk
from pykernel.errors import LaunchError
from pykernel.launch import Launcher

cuda_runtime = pytest.importorskip("pykernel.runtime.cuda",
                                   reason="cuda-python is needed for the CUDA device class")
from tests.runtime.fakes import arrays, mock_cuda_device  # noqa: E402
from tests.runtime.test_launch_variants import DriverCalls, add  # noqa: E402


@pytest.fixture
def mocked(monkeypatch):
    """make(ordinal) -> a mocked sm_90 CudaDevice, the first one made current; every driver
    call is recorded in `calls.calls`, every full-path call in `full`."""
    calls, full = DriverCalls(add.runtime_params), []
    monkeypatch.setattr(cuda_runtime, "_launch_kernel", calls)
    call = Launcher._call
    monkeypatch.setattr(Launcher, "_call",
                        lambda self, *a, **k: full.append(a) or call(self, *a, **k))
    add._launchers.clear()
    saved = pk.runtime.device._current
    made = []

    def make(ordinal=0):
        made.append(mock_cuda_device("sm_90", ordinal=ordinal))
        if len(made) == 1:
            pk.set_device(made[0])
        return made[-1]
    yield make, calls, full
    pk.runtime.device._current = saved
    add._launchers.clear()


def warm(launcher, *args):
    launcher(*args)
    launcher(*args)
    assert launcher.func.__name__ == "launch", "the generated fast function is in place"


def refusal(launcher, *args, **kwargs) -> str:
    with pytest.raises(LaunchError) as info:
        launcher(*args, **kwargs)
    return str(info.value)


def fresh_refusal(block, *args) -> str:
    """The message of a launcher's first call, which is the full path."""
    launcher = add[1, block]
    assert launcher.func.__name__ != "launch"
    return refusal(launcher, *args)


def test_keywords_and_wrong_counts_go_through_the_full_path(mocked, rng, seed):
    make, calls, full = mocked
    device = make()
    n = int(rng.integers(1, 4096))
    x, y, out = arrays(device, n)
    launcher = add[3, 64]
    warm(launcher, x, y, out, n)
    launcher(x, y, out=out, n=n - 1)
    assert calls.calls[-1][3] == (x.ptr, y.ptr, out.ptr, n - 1), f"seed={seed}"
    assert len(full) == 3, "keywords went to the full path"
    assert "missing argument(s) n" in refusal(launcher, x, y, out)
    assert "takes 4 arguments (x, y, out, n), got 5" in refusal(launcher, x, y, out, n, n)
    assert "unknown parameter 'm'" in refusal(launcher, x, y, out, n, m=1)
    assert "missing argument(s) x, y, out, n" in refusal(launcher)
    launcher(y, x, out, n)
    assert len(full) == 7 and calls.calls[-1][3] == (y.ptr, x.ptr, out.ptr, n), \
        "back on the fast path with the next plain call"


def test_another_gpus_array_is_refused_as_on_the_full_path(mocked):
    make, calls, _ = mocked
    device, other = make(0), make(1)
    x, y, out = arrays(device, 64)
    foreign = arrays(other, 64)[0]
    launcher = add[1, 64]
    warm(launcher, x, y, out, 64)
    message = refusal(launcher, x, foreign, out, 64)
    assert message == fresh_refusal(32, x, foreign, out, 64)
    assert "parameter 'y' expects an array on cuda:0" in message
    assert "this array is on cuda:1" in message
    assert len(calls.calls) == 2, "the refused launch reached no driver call"


def test_torch_tensors_through_the_inline_branch(mocked, rng, seed):
    torch = pytest.importorskip("torch")
    make, calls, full = mocked
    make(-1)                  # torch's device number of host tensors: CPU tensors qualify
    n = int(rng.integers(8, 4096))
    x, y, out = (torch.from_numpy(rng.standard_normal(n).astype(np.float32))
                 for _ in range(3))
    launcher = add[2, 128]
    warm(launcher, x, y, out, n)
    scope = launcher.func.__globals__
    assert scope["Tensor"] is torch.Tensor and scope["Ta0"] is torch.float32
    for args in ((x, y, out, n), (x[1:], y[2:], out[:n - 3], n - 3)):
        launcher(*args)
        assert calls.calls[-1][3] == tuple(a.data_ptr() for a in args[:3]) + args[3:], \
            f"seed={seed}"
    assert len(full) == 2, "every plain call after the first two took the fast path"
    # refused by the inline branch, explained by the full path's checks (which see host
    # tensors on a CUDA device: the messages of each check are test_fast_launch.py's)
    for bad in (x.double(), x[::2], x.to(torch.bfloat16)):
        message = refusal(launcher, bad, y, out, n)
        assert "add(): parameter 'x' expects a cuda array of float32" in message
        assert message == fresh_refusal(64, bad, y, out, n)
    assert len(calls.calls) == 4, "no refused launch reached the driver"


def test_a_cpu_tensor_on_a_gpu_launch_is_refused_as_on_the_full_path(mocked):
    torch = pytest.importorskip("torch")
    make, _, _ = mocked
    device = make(0)
    x, y, out = arrays(device, 32)
    launcher = add[1, 32]
    warm(launcher, x, y, out, 32)
    host = torch.zeros(32)
    for _ in range(2):              # before and after torch's inline branch is bound
        message = refusal(launcher, host, y, out, 32)
        assert "parameter 'x' expects a cuda array of float32" in message
        assert "it is on cpu" in message and message == fresh_refusal(16, host, y, out, 32)


class TensorLookalike:
    """The attributes the inline torch branch reads, on a class that is not torch.Tensor."""
    dtype = "float32"

    def __init__(self, address):
        self.address = address

    def get_device(self):
        return 0

    def is_contiguous(self):
        return True

    def data_ptr(self):
        return self.address


def test_a_tensor_lookalike_is_not_taken_for_a_tensor(mocked):
    make, calls, _ = mocked
    device = make(0)
    x, y, out = arrays(device, 32)
    launcher = add[1, 32]
    warm(launcher, x, y, out, 32)
    fake = TensorLookalike(x.ptr)
    message = refusal(launcher, x, fake, out, 32)
    assert "parameter 'y' expects a cuda array of float32" in message
    assert "TensorLookalike" in message and message == fresh_refusal(16, x, fake, out, 32)
    assert len(calls.calls) == 2
