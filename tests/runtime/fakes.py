"""Stand-ins for the compiler's output and the CPU device, so runtime tests do not depend on
the compiler: `FakeCompiled` has the CompiledKernel attributes the runtime reads, and
`FakeHostDevice` runs a Python function on numpy views of the arguments."""
from __future__ import annotations

import ctypes
import itertools
from collections import namedtuple
from dataclasses import dataclass, field

import numpy as np

ParamABI = namedtuple("ParamABI", "name kind dtype size align readonly")
_keys = itertools.count()


def ptr(name, dtype, readonly=False):
    return ParamABI(name, "ptr", np.dtype(dtype) if dtype != "bfloat16" else dtype, 8, 8,
                    readonly)


def scalar(name, dtype):
    size = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
    return ParamABI(name, "scalar", np.dtype(dtype) if dtype != "bfloat16" else dtype, size,
                    size, False)


@dataclass
class FakeCompiled:
    name: str
    params: list
    ptx: str = ""
    entry: str = ""
    target: str = "nvptx"
    arch: str = "sm_75"
    shared_bytes: int = 0
    cache_key: str = field(default_factory=lambda: f"fake-{next(_keys)}")
    run: object = None  # FakeHostDevice: run(*args) with arrays as numpy views

    def __post_init__(self):
        self.entry = self.entry or self.name


def scale_kernel() -> FakeCompiled:
    """`scale(x: Ptr[f32], w: Ptr[bf16], n: i32)`: the kernel the tests of other libraries'
    arrays (torch, CuPy) pack arguments for."""
    return FakeCompiled("scale", [ptr("x", np.float32), ptr("w", "bfloat16"),
                                  scalar("n", np.int32)])


def torch_scale_args(torch, rng):
    """(x, w, n) for scale_kernel as torch host tensors: x random f32, w bf16 zeros, n
    random in 5..49."""
    n = int(rng.integers(5, 50))
    x = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
    return x, torch.zeros(n, dtype=torch.bfloat16), n


def host_view(array):
    """A numpy view of a host Array's memory (the fake device's 'kernel' writes through it)."""
    buffer = (ctypes.c_uint8 * array.nbytes).from_address(array.ptr)
    return np.frombuffer(buffer, dtype=array.dtype).reshape(array.shape)


class FakeHostDevice:
    kind, arch, name = "cpu", "host", "fake host device"

    def __init__(self):
        self.launched = []

    def launch(self, compiled, grid, block, args, stream=None, shared_bytes=0):
        self.launched.append(compiled.name)
        views = [host_view(a) if hasattr(a, "ptr") else a for a in args]
        compiled.run(*views)

    def synchronize(self):
        pass


class NoDriverMemory:
    """Device 'allocations' without a driver: fresh fake addresses, never dereferenced."""
    kind = "cuda"
    _next = 1 << 32

    def alloc(self, nbytes):
        address = NoDriverMemory._next
        NoDriverMemory._next += (nbytes + 255) // 256 * 256
        return None, address


def mock_cuda_device(arch: str = "sm_90", param_buffer: bool = True, ordinal: int = 0):
    """A CudaDevice that needs no driver: module loads skip cuda.core and give a null
    CUfunction. The caller replaces pykernel.runtime.cuda._launch_kernel (the final driver
    call) with its own function returning (0,). `param_buffer`: parameters handed over as one
    buffer (`extra`, the default) or through kernelParams. `ordinal`: the device number its
    packers check (benchmarks/launch_steps.py passes -1, torch's number for host tensors, so
    that CPU tensors take the CUDA launcher's torch branch)."""
    from collections import deque

    from cuda.bindings import driver as cu

    from pykernel.runtime import cuda as cuda_runtime
    device = cuda_runtime.CudaDevice.__new__(cuda_runtime.CudaDevice)
    device.ordinal, device.param_buffer, device.arch, device.name = ordinal, param_buffer, arch, \
        "mock"
    device.max_shared_optin, device.max_threads_per_block = 227 * 1024, 1024
    device.max_grid = (2 ** 31 - 1, 65535, 65535)
    device.memory, device.sync_launches = NoDriverMemory(), False
    device._kernels, device._recent = {}, deque(maxlen=16)
    device._launch_handle, device._capture = cu.CUstream(0), None
    device.programmatic_launch, device._prints = False, False

    def load(compiled):
        packer = cuda_runtime.ArgPacker(compiled, "cuda", ordinal, device=device)
        kernel = cuda_runtime.LoadedKernel(
            compiled.name, cu.CUfunction(), packer, 48 * 1024, compiled.shared_bytes, None,
            param_buffer, "pdl" in getattr(compiled, "uses", ()))
        device._kernels[compiled.cache_key] = kernel
        return kernel
    device.load = load
    return device


def arrays(device, n, dtype=np.float32):
    """Three uninitialised pk Arrays of n values on `device` (a mock CUDA device's memory
    included): the arguments of the launch tests' 4-parameter kernel."""
    from pykernel.runtime.arrays import Array
    return [Array(None, device.memory.alloc(4 * n)[1], (n,), np.dtype(dtype), device)
            for _ in range(3)]
