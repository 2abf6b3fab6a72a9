"""Host cost of a pykernel launch of a 4-argument kernel (`out = x + y` over n = 128 elements,
one block: the GPU's own time is negligible), in microseconds per launch.

Without `--gpu` (no driver needed): the CUDA device's whole launch path
(`kernel[grid, block](...)`: Launcher, specialization lookup, argument packing, dispatch) with
the final driver call (`cuLaunchKernel`) replaced by a function returning (0,), so what is left
is pykernel's own Python; best of BATCHES batches. Rows: the mocked driver call alone, own
arrays (the configuration looked up per call, and a kept launcher; parameters as one buffer
through `extra`, the default, and one by one through kernelParams), a bound launch
(`launcher.bind(...)` then `.launch()`), objects exposing `__cuda_array_interface__`, and
torch tensors (CPU tensors through the cpu kind's packer: the same attribute reads as CUDA
ones; skipped without torch). benchmarks/launch_steps.py splits these per statement.

With `--gpu` (the lead's H200 run): the same launches on the real device, each batch of
BATCH launches (shorter than the driver's queue) followed by an untimed synchronize; median
and best of the batches. Rows: the raw floor (cuda.bindings' cuLaunchKernel with a pre-packed
`extra` buffer, nothing else), the bound launch, own arrays (kept launcher and per call),
`__cuda_array_interface__` objects, torch CUDA tensors through the kept launcher, and the raw
floor again once torch has initialised CUDA (skipped without torch with CUDA).

    python3 benchmarks/launch_host_cost.py [--gpu]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks._timing import host_us_per_call  # noqa: E402
from pykernel.runtime import cuda as cuda_runtime  # noqa: E402
from pykernel.runtime.arrays import Array  # noqa: E402
from pykernel.runtime.device import set_device  # noqa: E402
from tests.runtime import fakes  # noqa: E402

N = 128
BATCH, BATCHES = 200, 50         # 10,000 launches per row


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


def per_launch_us(launch_once, synchronize=None) -> tuple[float, float]:
    """(median, best) us per launch over BATCHES batches of BATCH launches; `synchronize`
    (untimed) after each batch keeps the driver's queue from filling."""
    launch_once()
    samples = host_us_per_call(launch_once, BATCH, BATCHES, synchronize)
    return statistics.median(samples), min(samples)


class CudaArrayInterfaceObject:
    """A foreign device array: only `__cuda_array_interface__` (as CuPy builds it per call)."""

    def __init__(self, ptr, n):
        self.ptr, self.n = ptr, n

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.n,), "typestr": "<f4", "data": (self.ptr, False),
                "strides": None, "version": 3}


def device_arrays(device) -> list:
    """Three f32 arrays of N on `device`: fake addresses on a mocked device, allocations on a
    real one."""
    if isinstance(device.memory, fakes.NoDriverMemory):
        return [Array(None, device.memory.alloc(N * 4)[1], (N,), np.dtype(np.float32), device)
                for _ in range(3)]
    return [pk.zeros(N, np.float32, device=device) for _ in range(3)]


def raw_floor(device, args):
    """The bare driver call of add4 with `args` packed once into a buffer of its own."""
    from cuda.bindings import driver as cu
    kernel = next(k for k in device._kernels.values() if k.name == add4.name)
    kernel.pack(args)
    owner, params, extra = kernel.packer.snapshot()
    params, extra = (0, extra) if kernel.param_buffer else (params, 0)
    func, stream, launch = kernel.func, cu.CUstream(0), cu.cuLaunchKernel
    return lambda owner=owner: launch(func, 1, 1, 1, N, 1, 1, 0, stream, params, extra)


def rows(device, sync) -> list:
    """[(label, (median, best))] of the launches both modes measure."""
    launcher = add4[1, N]
    x, y, out = device_arrays(device)
    table = []
    if sync is not None:     # the real driver: the floor first
        launcher(x, y, out, N)
        table.append(("raw cuLaunchKernel, pre-packed `extra` (floor)",
                      per_launch_us(raw_floor(device, (x, y, out, N)), sync)))
    table += [("bound launch, .launch()", per_launch_us(launcher.bind(x, y, out, N).launch,
                                                         sync)),
              ("own arrays, launcher(...) (`launcher = kernel[grid, block]` kept)",
               per_launch_us(lambda: launcher(x, y, out, N), sync)),
              ("own arrays, kernel[grid, block](...) (configuration looked up per call)",
               per_launch_us(lambda: add4[1, N](x, y, out, N), sync))]
    cai = [CudaArrayInterfaceObject(a.ptr, N) for a in (x, y, out)]
    table.append(("__cuda_array_interface__ objects, launcher kept",
                  per_launch_us(lambda: launcher(*cai, N), sync)))
    return table + (_torch_gpu_rows(device, launcher, sync, (x, y, out)) if sync is not None
                    else _torch_host_rows())


def _torch_gpu_rows(device, launcher, sync, own) -> list:
    try:
        import torch
    except ImportError:
        return [("torch CUDA tensors, launcher kept (no torch)", (float("nan"),) * 2)]
    if not torch.cuda.is_available():
        return [("torch CUDA tensors, launcher kept (torch without CUDA)", (float("nan"),) * 2)]
    tensors = [torch.zeros(N, device="cuda") for _ in range(3)]
    return [("torch CUDA tensors, launcher kept", per_launch_us(lambda: launcher(*tensors, N),
                                                                sync)),
            ("raw cuLaunchKernel again, torch initialised",
             per_launch_us(raw_floor(device, (*own, N)), sync))]


def _torch_host_rows() -> list:
    """torch tensors through the packer of the cuda kind need CUDA tensors; CPU tensors go
    through the cpu kind's packer, the same attribute reads (dtype, device, contiguity,
    data_ptr)."""
    try:
        import torch
    except ImportError:
        return [("torch tensors (packing only, cpu kind)", (float("nan"),) * 2)]
    from pykernel.runtime.packer import ArgPacker
    packer = ArgPacker(add4.compile("cpu"), "cpu")
    tensors = [torch.zeros(N, dtype=torch.float32) for _ in range(3)]
    own = [pk.zeros(N, np.float32, device=pk.get_device("cpu")) for _ in range(3)]
    return [("own arrays (packing only, cpu kind)", per_launch_us(lambda: packer.pack((*own, N)))),
            ("torch tensors (packing only, cpu kind)",
             per_launch_us(lambda: packer.pack((*tensors, N))))]


def kernel_params_row() -> tuple:
    """The kept launcher on a mocked device passing the fields one by one (kernelParams)."""
    device = set_device(mock_cuda_device(param_buffer=False))
    launcher, (x, y, out) = add4[1, N], device_arrays(device)
    return ("own arrays, launcher(...) kept, kernelParams (param_buffer=False)",
            per_launch_us(lambda: launcher(x, y, out, N)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true",
                        help="launch on the real CUDA device (median of batches, each synced)")
    options = parser.parse_args()
    if options.gpu:
        if not pk.runtime.device.gpu_available():
            sys.exit("launch_host_cost --gpu: no usable CUDA GPU")
        device = set_device("cuda")
        print(f"| launch on {device} | median us | best us |\n|---|---|---|")
        table = rows(device, device.synchronize)
    else:
        device = set_device(mock_cuda_device())
        print("| launch path (cuLaunchKernel mocked) | median us | best us |\n|---|---|---|")
        ok = (0,)
        mocked = per_launch_us(lambda: cuda_runtime._launch_kernel(0, 1, 1, 1, N, 1, 1, 0, 0,
                                                                   0, ok))
        table = [("the mocked driver call alone", mocked), *rows(device, None),
                 kernel_params_row()]
    for name, (median, best) in table:
        print(f"| {name} | {median:.2f} | {best:.2f} |")
    print(f"({BATCHES} batches of {BATCH} launches per row)")


if __name__ == "__main__":
    main()
