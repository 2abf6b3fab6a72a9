"""Host-side cost of a pykernel launch without a GPU: the CUDA device's whole launch path
(`kernel[grid, block](...)`: Launcher, specialization lookup, argument packing, dispatch) with
the final driver call (`cuLaunchKernel`) replaced by a no-op, so what is left is pykernel's own
Python. The driver call itself adds ~2-4 us on a real GPU host (benchmarks/RESULTS.md: the bare
cuda.bindings call measured 3.94 us on an H200 host); benchmarks/dsl_peers.py measures the
real launch on the GPU.

Input: none (compiles one 4-argument kernel for sm_90 with LLVM; no driver needed).
Output: a table of microseconds per launch (best batch) for own arrays (the configuration
looked up per call, and a kept launcher; parameters as one buffer through `extra`, the
default, and one by one through kernelParams), a bound launch
(`launcher.bind(...)` then `.launch()`), torch tensors (CPU tensors: the same attribute reads as
CUDA ones; skipped without torch) and an object exposing `__cuda_array_interface__`.

    python3 benchmarks/launch_host_cost.py
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from pykernel.runtime import cuda as cuda_runtime  # noqa: E402
from pykernel.runtime.arrays import Array  # noqa: E402
from pykernel.runtime.device import set_device  # noqa: E402
from tests.runtime import fakes  # noqa: E402

N, BATCH, BATCHES = 1 << 20, 2000, 25


@pk.kernel
def add4(x: pk.Ptr[pk.f32], y: pk.Ptr[pk.f32], out: pk.Ptr[pk.f32], n: pk.i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        out[i] = x[i] + y[i]


def mock_cuda_device(param_buffer: bool = True, ordinal: int = 0):
    device = fakes.mock_cuda_device("sm_90", param_buffer=param_buffer, ordinal=ordinal)
    ok = (0,)
    cuda_runtime._launch_kernel = lambda *args: ok
    return device


def mock_driver_call_us() -> float:
    """The mocked driver call alone (its Python call of 11 arguments), to subtract."""
    return per_launch_us(lambda: cuda_runtime._launch_kernel(0, 1, 1, 1, 256, 1, 1, 0, 0, 0, 0))


def per_launch_us(launch_once) -> float:
    launch_once()
    samples = []
    for _ in range(BATCHES):
        start = time.perf_counter()
        for _ in range(BATCH):
            launch_once()
        samples.append((time.perf_counter() - start) / BATCH * 1e6)
    return min(samples)      # the least disturbed batch (a shared host only adds time)


class CudaArrayInterfaceObject:
    """A foreign device array: only `__cuda_array_interface__` (as CuPy builds it per call)."""

    def __init__(self, ptr, n):
        self.ptr, self.n = ptr, n

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.n,), "typestr": "<f4", "data": (self.ptr, False),
                "strides": None, "version": 3}


def device_arrays(device) -> list:
    return [Array(None, device.memory.alloc(N * 4)[1], (N,), np.dtype(np.float32), device)
            for _ in range(3)]


def kernel_params_row() -> tuple:
    """The kept launcher on a device passing the fields one by one (kernelParams)."""
    device = set_device(mock_cuda_device(param_buffer=False))
    launcher, (x, y, out) = add4[-(-N // 256), 256], device_arrays(device)
    return ("own arrays, launcher(...) kept, kernelParams (param_buffer=False)",
            per_launch_us(lambda: launcher(x, y, out, N)))


def rows(device) -> list:
    grid, block = -(-N // 256), 256
    launcher = add4[grid, block]
    x, y, out = device_arrays(device)
    table = [("own arrays, kernel[grid, block](...) (configuration looked up per call)",
              per_launch_us(lambda: add4[grid, block](x, y, out, N))),
             ("own arrays, launcher(...) (`launcher = kernel[grid, block]` kept)",
              per_launch_us(lambda: launcher(x, y, out, N)))]
    bind = getattr(launcher, "bind", None)
    if bind is not None:
        bound = bind(x, y, out, N)
        table.append(("bound launch, .launch()", per_launch_us(bound.launch)))
    cai = [CudaArrayInterfaceObject(a.ptr, N) for a in (x, y, out)]
    table.append(("__cuda_array_interface__ objects",
                  per_launch_us(lambda: launcher(*cai, N))))
    table += _torch_rows(launcher)
    return table


def _torch_rows(launcher) -> list:
    """torch tensors through the packer of the cuda kind need CUDA tensors; CPU tensors go
    through the cpu kind's packer, the same attribute reads (dtype, device, contiguity,
    data_ptr)."""
    try:
        import torch
    except ImportError:
        return [("torch tensors (packing only, cpu kind)", float("nan"))]
    from pykernel.runtime.packer import ArgPacker
    compiled = add4.compile("cpu")
    packer = ArgPacker(compiled, "cpu")
    tensors = [torch.zeros(N, dtype=torch.float32) for _ in range(3)]
    own = [pk.zeros(N, np.float32, device=pk.get_device("cpu")) for _ in range(3)]
    return [("own arrays (packing only, cpu kind)", per_launch_us(lambda: packer.pack((*own, N)))),
            ("torch tensors (packing only, cpu kind)",
             per_launch_us(lambda: packer.pack((*tensors, N))))]


def main():
    device = set_device(mock_cuda_device())
    print("| launch path (cuLaunchKernel mocked) | us per launch |\n|---|---|")
    print(f"| the mocked driver call alone | {mock_driver_call_us():.2f} |")
    for name, us in [*rows(device), kernel_params_row()]:
        print(f"| {name} | {us:.2f} |")


if __name__ == "__main__":
    main()
