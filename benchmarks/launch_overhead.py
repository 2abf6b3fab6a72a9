"""Host-side launch overhead of a 6-argument kernel (3 pointers, 3 scalars) on the CUDA device.

Input: none (needs a GPU). Output: a table of microseconds per launch, median and best of
BATCHES batches, for: the raw cuLaunchKernel floor (prebuilt params, nothing checked; with
kernelParams and with one `extra` buffer), cuda.core's `launch` with pre-converted arguments,
the packer alone, pykernel's `device.launch` (checks and packs every argument; one buffer
through `extra`, the default, and the fields one by one through kernelParams), a replayed CUDA
graph (per captured kernel), the compiler's `kernel[grid, block](...)` launcher (looked up per
call, kept, bound; both parameter passing modes), torch CUDA tensors through the kept launcher
beside the raw floor measured again with torch initialized (when torch has CUDA), the same
computation as a `@pk.elementwise` call (shape and alignment checks, output given) and as an
`@pk.autotune`d kernel once tuned.

Only the launch calls are timed; each batch (shorter than the driver's launch queue) is followed
by an untimed synchronize, so GPU execution time never leaks into the figures.

    python3 benchmarks/launch_overhead.py
"""
from __future__ import annotations

import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks._timing import host_us_per_call  # noqa: E402
from pykernel.runtime import arrays as ar  # noqa: E402
from pykernel.runtime import device as dv  # noqa: E402
from pykernel.runtime.cuda import CudaDevice  # noqa: E402
from pykernel.runtime.graphs import capture_graph  # noqa: E402
from pykernel.runtime.streams import Stream  # noqa: E402
from tests.runtime.ptx_kernels import six  # noqa: E402

BATCH, BATCHES, N = 200, 60, 128


def per_launch_us(launch_once, synchronize) -> tuple[float, float]:
    samples = host_us_per_call(launch_once, BATCH, BATCHES, after_batch=synchronize)
    return statistics.median(samples), min(samples)


def bench_ctypes(gpu, kernel, args):
    """The same driver call through ctypes (libcuda's C entry point, no cuda.bindings
    wrapper): how much of the floor is the binding's argument conversion."""
    import ctypes
    libcuda = ctypes.CDLL("libcuda.so.1")
    launch = libcuda.cuLaunchKernel
    launch.restype = ctypes.c_int
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    loaded = gpu.load(kernel)
    loaded.packer.pack(args)
    func, params = int(loaded.func), loaded.params_address
    return lambda: launch(func, 1, 1, 1, N, 1, 1, 0, None, params, None)


def bench_raw(gpu, kernel, args, param_buffer=False):
    from cuda.bindings import driver as cu
    loaded = gpu.load(kernel)
    loaded.packer.pack(args)
    func, stream, launch = loaded.func, cu.CUstream(0), cu.cuLaunchKernel
    if param_buffer:
        extra = loaded.packer.extra_address
        return lambda: launch(func, 1, 1, 1, N, 1, 1, 0, stream, 0, extra)
    params = loaded.params_address
    return lambda: launch(func, 1, 1, 1, N, 1, 1, 0, stream, params, 0)


def bench_cuda_core(gpu, kernel, args):
    from cuda.core import LaunchConfig, launch
    core_kernel = gpu.load(kernel).code.get_kernel("six")
    n, a, b, x, y, out = args
    converted = (np.uint32(n), np.float32(a), np.float32(b), np.uint64(x.ptr),
                 np.uint64(y.ptr), np.uint64(out.ptr))
    config, stream = LaunchConfig(grid=1, block=N), gpu.core.default_stream
    return lambda: launch(stream, config, core_kernel, *converted)


def bench_pack_only(gpu, kernel, args):
    packer = gpu.load(kernel).packer
    return lambda: packer.pack(args)


def bench_pykernel(gpu, kernel, args):
    grid, block = (1, 1, 1), (N, 1, 1)
    return lambda: gpu.launch(kernel, grid, block, args)


def bench_graph_replay(gpu, kernel, args):
    """A graph of BATCH captured launches, replayed: reported per captured kernel."""
    stream = Stream(gpu)
    with capture_graph(stream) as graph:
        for _ in range(BATCH):
            gpu.launch(kernel, (1, 1, 1), (N, 1, 1), args)
    replays = iter(range(1 << 30))

    def replay_or_skip():  # one replay per BATCH calls keeps the per-launch figure comparable
        if next(replays) % BATCH == 0:
            graph.replay()
    return replay_or_skip


@pk.kernel
def six_dsl(n: pk.i32, a: pk.f32, b: pk.f32, x: pk.Ptr[pk.f32], y: pk.Ptr[pk.f32],
            out: pk.Ptr[pk.f32]):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        out[i] = a * x[i] + b * y[i]


def bench_dsl(gpu, args, kept=False):
    """The compiler's `kernel[grid, block](...)` launcher on device `gpu` (made current): the
    configuration looked up per call, or `launcher = kernel[grid, block]` kept."""
    dv.set_device(gpu)
    six_dsl[1, N](*args)
    if kept:
        launcher = six_dsl[1, N]
        return lambda: launcher(*args)
    return lambda: six_dsl[1, N](*args)


def bench_bound(gpu, args):
    dv.set_device(gpu)
    return six_dsl[1, N].bind(*args).launch


def bench_torch(gpu, args, raw_floor=False):
    """Torch CUDA tensors through the kept launcher; `raw_floor`: the raw cuLaunchKernel call
    again, now that torch has initialized CUDA in this process (does torch's presence move the
    floor?)."""
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("torch without CUDA")
    dv.set_device(gpu)
    n = args[0]
    x, y, out = (torch.zeros(N, device="cuda") for _ in range(3))
    if raw_floor:
        return bench_raw(gpu, six(), args)
    launcher = six_dsl[1, N]
    launcher(n, 3.0, 0.5, x, y, out)
    return lambda: launcher(n, 3.0, 0.5, x, y, out)


def bench_elementwise(gpu, args):
    """`@pk.elementwise` with out= given: the call's checks on top of the launcher."""
    @pk.elementwise
    def six_elementwise(a: pk.f32, b: pk.f32, x: pk.f32, y: pk.f32) -> pk.f32:
        return a * x + b * y
    n, a, b, x, y, out = args
    six_elementwise(a, b, x, y, out=out)
    return lambda: six_elementwise(a, b, x, y, out=out)


def bench_autotuned(gpu, args):
    """An `@pk.autotune`d kernel after its tuning: binding and the key lookup on top."""
    six_tuned = pk.autotune(configs=[{"threads": N}, {"threads": N // 2}], key=["n"],
                            launch=lambda a, c: (-(-a["n"] // c["threads"]), c["threads"]))(
                                six_dsl)
    six_tuned(*args)
    return lambda: six_tuned(*args)


def main() -> None:
    if not dv.gpu_available():
        sys.exit("launch_overhead: no usable CUDA GPU")
    gpu = dv.set_device("cuda")
    kernel = six()  # what the compiler would hand the runtime (duck-typed CompiledKernel)
    x, y = ar.full(N, 1.0, device=gpu), ar.full(N, 2.0, device=gpu)
    out = ar.zeros(N, device=gpu)
    args = (N, 3.0, 0.5, x, y, out)
    gpu.launch(kernel, (1, 1, 1), (N, 1, 1), args)
    assert np.allclose(out.numpy(), 4.0), "six-argument kernel computed a wrong result"
    print(f"device: {gpu}; {BATCHES} batches of {BATCH} launches; microseconds per launch")
    print(f"{'path':58s} {'median':>8s} {'best':>8s}")
    one_by_one = CudaDevice(gpu.ordinal, param_buffer=False)   # kernelParams, the old way
    paths = [("raw cuLaunchKernel, prebuilt params (floor)", lambda: bench_raw(gpu, kernel, args)),
             ("raw cuLaunchKernel through ctypes, prebuilt params",
              lambda: bench_ctypes(gpu, kernel, args)),
             ("raw cuLaunchKernel, one param buffer via `extra`",
              lambda: bench_raw(gpu, kernel, args, param_buffer=True)),
             ("cuda.core launch(), pre-converted args", lambda: bench_cuda_core(gpu, kernel, args)),
             ("ArgPacker.pack alone (check + pack 6 args, no launch)",
              lambda: bench_pack_only(gpu, kernel, args)),
             ("pykernel device.launch (check + pack 6 args, one buffer)",
              lambda: bench_pykernel(gpu, kernel, args)),
             ("pykernel device.launch, kernelParams (param_buffer=False)",
              lambda: bench_pykernel(one_by_one, kernel, args)),
             ("graph replay, per captured kernel", lambda: bench_graph_replay(gpu, kernel, args)),
             ("pykernel kernel[grid, block](...) (compiler's launcher)",
              lambda: bench_dsl(gpu, args)),
             ("pykernel launcher(...) kept, one buffer via `extra`",
              lambda: bench_dsl(gpu, args, kept=True)),
             ("pykernel launcher(...) kept, kernelParams (param_buffer=False)",
              lambda: bench_dsl(one_by_one, args, kept=True)),
             ("pykernel bound launch .launch()", lambda: bench_bound(gpu, args)),
             ("torch tensors, launcher(...) kept", lambda: bench_torch(gpu, args)),
             ("raw cuLaunchKernel again, torch initialized",
              lambda: bench_torch(gpu, args, raw_floor=True)),
             ("@pk.elementwise call, out= given", lambda: bench_elementwise(gpu, args)),
             ("@pk.autotune'd kernel call, tuned", lambda: bench_autotuned(gpu, args))]
    for label, make in paths:
        dv.set_device(gpu)       # rows of the kernelParams device make that one current
        try:
            launch_once = make()
        except Exception as exc:  # a path that is not available yet is reported, not fatal
            print(f"{label:58s} unavailable: {type(exc).__name__}: {str(exc)[:80]}")
            continue
        median, best = per_launch_us(launch_once, gpu.synchronize)
        print(f"{label:58s} {median:8.2f} {best:8.2f}")


if __name__ == "__main__":
    main()
