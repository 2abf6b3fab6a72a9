"""The CUDA device on a real GPU, with hand-written PTX kernels (no compiler needed)."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pykernel.errors import KernelRuntimeError, LaunchError
from pykernel.runtime import arrays as ar
from pykernel.runtime import device as dv
from pykernel.runtime.graphs import capture_graph
from pykernel.runtime.streams import Event, Stream
from tests.runtime import ptx_kernels as kernels
from tests.child_env import child_env

pytestmark = pytest.mark.gpu
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def gpu():
    if not dv.gpu_available():
        pytest.skip("no usable CUDA GPU (driver missing or no device)")
    return dv.get_device("cuda")


def run_saxpy(gpu, n, a, x, y, stream=None):
    gpu.launch(kernels.saxpy(), ((n + 127) // 128, 1, 1), (128, 1, 1), (n, a, x, y), stream)


def test_device_properties(gpu):
    assert gpu.kind == "cuda" and gpu.arch.startswith("sm_") and gpu.name
    print(f"device: {gpu}")


def test_saxpy_matches_numpy(gpu, rng, seed):
    n = 1000 + int(rng.integers(0, 3000))
    hx, hy = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    x, y = ar.to_device(hx, device=gpu), ar.to_device(hy, device=gpu)
    saxpy = kernels.saxpy()
    for _ in range(2):  # second launch: cached module and packer
        gpu.launch(saxpy, ((n + 127) // 128, 1, 1), (128, 1, 1), (n, 1.5, x, y))
        hy = np.float32(1.5) * hx + hy
    np.testing.assert_allclose(y.numpy(), hy, rtol=1e-6, atol=1e-6, err_msg=f"seed={seed}")


def test_views_are_offset_pointers(gpu, rng, seed):
    pool = ar.full((4, 256), np.nan, np.float32, device=gpu)
    hx = rng.standard_normal(256).astype(np.float32)
    x = ar.to_device(hx, device=gpu)
    pool[1:3] = 0.0
    run_saxpy(gpu, 256, 2.0, x, pool[2])
    out = pool.numpy()
    assert np.isnan(out[0]).all() and np.isnan(out[3]).all(), "write outside the view"
    np.testing.assert_array_equal(out[1], 0.0)
    np.testing.assert_allclose(out[2], 2.0 * hx, rtol=1e-6, err_msg=f"seed={seed}")


def test_launch_argument_errors(gpu):
    x = ar.zeros(8, np.float32, device=gpu)
    saxpy = kernels.saxpy()
    with pytest.raises(LaunchError, match=r"parameter 'x'.*pk.to_device"):
        gpu.launch(saxpy, (1, 1, 1), (32, 1, 1), (8, 1.0, np.zeros(8, np.float32), x))
    with pytest.raises(LaunchError, match=r"parameter 'n'.*\[0, 4294967295\]"):
        gpu.launch(saxpy, (1, 1, 1), (32, 1, 1), (-1, 1.0, x, x))
    with pytest.raises(LaunchError, match=r"saxpy.*2048 threads"):
        gpu.launch(saxpy, (1, 1, 1), (2048, 1, 1), (8, 1.0, x, x))


def test_torch_interop_without_copies(gpu, rng, seed):
    torch = pytest.importorskip("torch")
    hx = rng.standard_normal(300).astype(np.float32)
    tx = torch.from_numpy(hx).cuda()
    ty = torch.zeros(300, device="cuda")
    run_saxpy(gpu, 300, 3.0, tx, ty)          # __cuda_array_interface__ objects as Ptr args
    torch.cuda.synchronize()
    np.testing.assert_allclose(ty.cpu().numpy(), 3.0 * hx, rtol=1e-6, err_msg=f"seed={seed}")
    ours = ar.to_device(hx, device=gpu)
    shared = torch.from_dlpack(ours)          # our array seen by torch, same memory
    assert shared.data_ptr() == ours.ptr
    shared.mul_(2.0)
    torch.cuda.synchronize()
    np.testing.assert_allclose(ours.numpy(), 2.0 * hx, rtol=1e-6)
    viewed = torch.as_tensor(ours, device="cuda")  # through __cuda_array_interface__
    assert viewed.data_ptr() == ours.ptr


def test_streams_and_events(gpu, rng, seed):
    n = 1 << 20
    hx = rng.standard_normal(n).astype(np.float32)
    x, y = ar.to_device(hx, device=gpu), ar.zeros(n, np.float32, device=gpu)
    stream, start, end = Stream(gpu), Event(gpu), Event(gpu)
    start.record(stream)
    for _ in range(10):
        run_saxpy(gpu, n, 1.0, x, y, stream)
    end.record(stream)
    stream.synchronize()
    elapsed = start.elapsed_ms(end)
    assert 0.0 < elapsed < 1000.0
    np.testing.assert_allclose(y.numpy(), 10 * hx, rtol=1e-5, err_msg=f"seed={seed}")


def test_graph_replay_with_device_scalar_and_updates(gpu, rng, seed):
    n = 512
    hx = rng.standard_normal(n).astype(np.float32)
    x, y = ar.to_device(hx, device=gpu), ar.zeros(n, np.float32, device=gpu)
    scale = ar.full(1, 1.0, np.float32, device=gpu)
    axpy_dev, saxpy = kernels.axpy_device_scale(), kernels.saxpy()
    stream = Stream(gpu)
    with capture_graph(stream) as graph:
        gpu.launch(axpy_dev, (4, 1, 1), (128, 1, 1), (n, scale, x, y))
        gpu.launch(saxpy, (4, 1, 1), (128, 1, 1), (n, 0.5, x, y))
    assert [launch.name for launch in graph.launches] == ["axpy_dev", "saxpy"]
    gpu.synchronize()
    np.testing.assert_array_equal(y.numpy(), 0.0, err_msg="capture must not run launches")
    expected = np.zeros(n, np.float32)
    for step in range(3):
        scale.copy_from(np.float32([step]))    # a new value read from device memory
        graph.replay()
        stream.synchronize()
        expected = expected + np.float32(step) * hx + np.float32(0.5) * hx
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, err_msg=f"seed={seed}")
    graph.update_kernel_args(1, a=-2.0)         # a new scalar in the instantiated graph
    graph.replay()
    stream.synchronize()
    expected = expected + np.float32(2.0) * hx - np.float32(2.0) * hx
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, atol=1e-5, err_msg=f"seed={seed}")


def test_dynamic_shared_memory_above_48k(gpu, rng, seed):
    n = 1000
    hx = rng.standard_normal(n).astype(np.float32)
    x, y = ar.to_device(hx, device=gpu), ar.full(n, np.nan, np.float32, device=gpu)
    kernel = kernels.shared_roundtrip()
    gpu.launch(kernel, (4, 1, 1), (256, 1, 1), (n, x, y), None, 64 * 1024)
    np.testing.assert_array_equal(y.numpy(), hx, err_msg=f"seed={seed}")
    with pytest.raises(LaunchError, match=r"shared_roundtrip.*bytes of shared memory"):
        gpu.launch(kernel, (4, 1, 1), (256, 1, 1), (n, x, y), None, 1 << 20)


def test_jit_error_names_kernel_and_shows_log(gpu):
    with pytest.raises(KernelRuntimeError) as info:
        gpu.launch(kernels.broken(), (1, 1, 1), (1, 1, 1), (1,))
    message = str(info.value)
    print(message)
    assert "broken" in message and "error" in message.lower()


def test_out_of_memory_says_asked_and_free(gpu):
    with pytest.raises(MemoryError, match=r"asked for 1125899906842624 bytes.*free"):
        ar.empty(1 << 50, np.uint8, device=gpu)


FAULT_SCRIPT = textwrap.dedent("""
    import numpy as np
    from pykernel.runtime import arrays as ar, device as dv
    from tests.runtime import ptx_kernels as kernels
    gpu = dv.get_device("cuda")
    x = ar.zeros(64, np.float32, device=gpu)
    class Bogus:  # a device pointer that is not mapped
        __cuda_array_interface__ = {"data": (0x10, False), "shape": (64,), "typestr": "<f4",
                                    "version": 3, "strides": None}
    try:
        gpu.launch(kernels.saxpy(), (1, 1, 1), (64, 1, 1), (64, 1.0, x, Bogus()))
        gpu.synchronize()
    except Exception as exc:
        print("RAISED", type(exc).__name__, exc)
""")


@pytest.mark.parametrize("sync_launch", ["0", "1"])
def test_illegal_address_names_the_kernel(gpu, sync_launch):
    # in a subprocess: the fault makes the CUDA context unusable
    env = child_env(PYKERNEL_SYNC_LAUNCH=sync_launch)
    done = subprocess.run([sys.executable, "-c", FAULT_SCRIPT], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    print(output)
    assert "RAISED" in output and "saxpy" in output and "ILLEGAL_ADDRESS" in output, output


def test_param_buffer_mode_with_padding(gpu, rng, seed):
    """Arguments handed to the driver as one buffer (`extra`): the layout must match the
    kernel's, including the 4-byte hole before the first pointer of `six`."""
    from pykernel.runtime.cuda import CudaDevice
    buffered = CudaDevice(gpu.ordinal, param_buffer=True)
    n = 700
    hx, hy = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    x, y = ar.to_device(hx, device=gpu), ar.to_device(hy, device=gpu)
    out = ar.full(n, np.nan, np.float32, device=gpu)
    buffered.launch(kernels.six(), (3, 1, 1), (256, 1, 1), (n, 3.0, 0.5, x, y, out))
    buffered.synchronize()
    expected = np.float32(3.0) * hx + np.float32(0.5) * hy
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6, atol=1e-6,
                               err_msg=f"seed={seed}")
    buffered.launch(kernels.saxpy(), (3, 1, 1), (256, 1, 1), (n, -1.0, x, out))
    np.testing.assert_allclose(out.numpy(), expected - hx, rtol=1e-5, atol=1e-5,
                               err_msg=f"seed={seed}")
