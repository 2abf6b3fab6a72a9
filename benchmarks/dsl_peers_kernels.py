"""The kernels of benchmarks/dsl_peers.py in each system, and the numba-cuda, Triton and
cuda.core workers (each runs in its own process; imports happen inside, so a missing peer
fails only its own process). The same three computations everywhere: out = x + y one element
per thread, the same four per thread through 16-byte loads (where the system can express it),
and a row RMSNorm (one block per row, weight 1, eps 1e-6)."""
from __future__ import annotations

import time

# The pykernel side of the two adds is benchmarks/bandwidth.py's pair, under the names
# dsl_peers.py imports.
from benchmarks.bandwidth import add_scalar as pk_add  # noqa: F401
from benchmarks.bandwidth import add_vec4 as pk_add_vec4  # noqa: F401
from benchmarks.dsl_peers import Results, _torch, gbs, launch_us, torch_rows


# --- numba-cuda -------------------------------------------------------------------------------
def run_numba(sizes, first_only: bool) -> dict:
    import math

    import numpy as np
    if not hasattr(np, "row_stack"):
        # numba-cuda 0.30 registers an overload of np.row_stack, which NumPy 2.4 removed;
        # without this alias its import fails (the alias changes nothing that is timed)
        np.row_stack = np.vstack
    from numba import cuda, float32

    @cuda.jit
    def rmsnorm(x, w, out, cols, eps):
        row, t = cuda.blockIdx.x, cuda.threadIdx.x
        partial = cuda.shared.array(256, float32)
        acc = float32(0.0)
        for c in range(t, cols, 256):
            acc += x[row, c] * x[row, c]
        partial[t] = acc
        cuda.syncthreads()
        stride = 128
        while stride > 0:
            if t < stride:
                partial[t] += partial[t + stride]
            cuda.syncthreads()
            stride //= 2
        scale = float32(1.0) / math.sqrt(partial[0] / cols + eps)
        for c in range(t, cols, 256):
            out[row, c] = x[row, c] * scale * w[c]

    rows, cols = sizes.rows, sizes.cols
    res = Results()
    x = cuda.to_device(np.random.default_rng(0).standard_normal((rows, cols), np.float32))
    w, out = cuda.to_device(np.ones(cols, np.float32)), cuda.device_array_like(x)
    start = time.perf_counter()
    rmsnorm[rows, 256](x, w, out, cols, np.float32(1e-6))
    cuda.synchronize()
    res["warm_first_ms" if first_only else "first_ms"] = (time.perf_counter() - start) * 1e3
    if first_only:
        return res
    res.measure("rmsnorm_gbs", gbs, lambda: rmsnorm[rows, 256](x, w, out, cols,
                                                                 np.float32(1e-6)),
                cuda.synchronize, 8 * rows * cols, sizes)

    @cuda.jit
    def add(x, y, out, n):
        i = cuda.grid(1)
        if i < n:
            out[i] = x[i] + y[i]

    small = [cuda.device_array(128, np.float32) for _ in range(3)]
    res.measure("launch_own_us", launch_us, lambda: add[1, 128](*small, 128),
                cuda.synchronize, sizes)
    n = sizes.vec_n
    big = [cuda.device_array(n, np.float32) for _ in range(3)]
    res.measure("add_scalar_gbs", gbs, lambda: add[-(-n // 256), 256](*big, n),
                cuda.synchronize, 12 * n, sizes)
    big.clear()     # frees the 3 GiB before the next measure
    torch = _torch()
    if torch is not None:
        tensors = [torch.zeros(128, device="cuda") for _ in range(3)]
        res.measure("launch_torch_us", launch_us, lambda: add[1, 128](*tensors, 128),
                    torch.cuda.synchronize, sizes)
        torch_rows(res, torch, sizes, tensors)
    return res


# --- Triton (its arrays are torch tensors) ----------------------------------------------------
def run_triton(sizes, first_only: bool) -> dict:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def rmsnorm(x_ptr, w_ptr, out_ptr, cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < cols
        x = tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0)
        scale = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / cols + eps)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        tl.store(out_ptr + row * cols + offs, x * scale * w, mask=mask)

    @triton.jit
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) +
                 tl.load(y_ptr + offs, mask=mask), mask=mask)

    rows, cols = sizes.rows, sizes.cols
    res, sync = Results(), torch.cuda.synchronize
    x = torch.randn(rows, cols, device="cuda")
    w, out = torch.ones(cols, device="cuda"), torch.empty_like(x)
    block = triton.next_power_of_2(cols)
    start = time.perf_counter()
    rmsnorm[(rows,)](x, w, out, cols, 1e-6, BLOCK=block, num_warps=8)
    sync()
    res["warm_first_ms" if first_only else "first_ms"] = (time.perf_counter() - start) * 1e3
    if first_only:
        return res
    res.measure("rmsnorm_gbs", gbs, lambda: rmsnorm[(rows,)](x, w, out, cols, 1e-6,
                                                               BLOCK=block, num_warps=8),
                sync, 8 * rows * cols, sizes)
    tensors = [torch.zeros(128, device="cuda") for _ in range(3)]
    res.measure("launch_torch_us", launch_us, lambda: add[(1,)](*tensors, 128, BLOCK=128),
                sync, sizes)
    n = sizes.vec_n
    big = [torch.empty(n, device="cuda") for _ in range(3)]
    # Triton picks its own vector width: 1024 elements per program, 16-byte accesses
    res.measure("add_vec16_gbs", gbs, lambda: add[(triton.cdiv(n, 1024),)](*big, n,
                                                                           BLOCK=1024),
                sync, 12 * n, sizes)
    big.clear()     # frees the 3 GiB before the next measure
    torch_rows(res, torch, sizes, tensors)
    return res


# --- cuda.core (NVRTC C++) --------------------------------------------------------------------
CUDA_SOURCE = r"""
extern "C" __global__ void rmsnorm(const float* x, const float* w, float* out, int cols,
                                   float eps) {
    __shared__ float partial[32];
    const float* xr = x + (long long)blockIdx.x * cols;
    float acc = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) acc += xr[c] * xr[c];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, o);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = acc;
    __syncthreads();
    float total = 0.f;
    for (int k = 0; k < blockDim.x / 32; ++k) total += partial[k];
    float scale = rsqrtf(total / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        out[(long long)blockIdx.x * cols + c] = xr[c] * scale * w[c];
}
extern "C" __global__ void add(const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + y[i];
}
extern "C" __global__ void add_vec4(const float4* x, const float4* y, float4* out, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 a = x[i], b = y[i];
        out[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
    }
}
"""


def run_cuda_core(sizes, first_only: bool) -> dict:
    import numpy as np
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

    device = Device()
    device.set_current()
    stream, sync = device.default_stream, device.sync
    rows, cols = sizes.rows, sizes.cols
    res = Results()

    def allocate(nbytes):     # cuda.core >= 1.0 wants the stream the allocation orders on
        return device.allocate(nbytes, stream=stream)
    x, out = allocate(4 * rows * cols), allocate(4 * rows * cols)
    w = allocate(4 * cols)
    start = time.perf_counter()
    program = Program(CUDA_SOURCE, code_type="c++",
                      options=ProgramOptions(arch=f"sm_{device.arch}", std="c++17"))
    module = program.compile("cubin")
    rmsnorm = module.get_kernel("rmsnorm")
    norm_args = (x, w, out, np.int32(cols), np.float32(1e-6))
    launch(stream, LaunchConfig(grid=rows, block=256), rmsnorm, *norm_args)
    sync()
    res["warm_first_ms" if first_only else "first_ms"] = (time.perf_counter() - start) * 1e3
    if first_only:
        return res
    res.measure("rmsnorm_gbs", gbs, lambda: launch(stream, LaunchConfig(grid=rows, block=256),
                                                   rmsnorm, *norm_args),
                sync, 8 * rows * cols, sizes)
    add, add_vec4 = module.get_kernel("add"), module.get_kernel("add_vec4")
    small = [allocate(512) for _ in range(3)]
    config = LaunchConfig(grid=1, block=128)
    res.measure("launch_own_us", launch_us,
                lambda: launch(stream, config, add, *small, np.int32(128)), sync, sizes)
    n = sizes.vec_n
    big = [allocate(4 * n) for _ in range(3)]
    scalar_config = LaunchConfig(grid=-(-n // 256), block=256)
    res.measure("add_scalar_gbs", gbs, lambda: launch(stream, scalar_config, add, *big,
                                                      np.int32(n)), sync, 12 * n, sizes)
    vec_config = LaunchConfig(grid=-(-n // 1024), block=256)
    res.measure("add_vec16_gbs", gbs, lambda: launch(stream, vec_config, add_vec4, *big,
                                                     np.int32(n // 4)), sync, 12 * n, sizes)
    big.clear()     # frees the 3 GiB before the next measure
    torch = _torch()
    if torch is not None:
        tensors = [torch.zeros(128, device="cuda") for _ in range(3)]
        res.measure("launch_torch_us", launch_us, lambda: launch(
            stream, config, add, *(np.uint64(t.data_ptr()) for t in tensors), np.int32(128)),
            torch.cuda.synchronize, sizes)
        torch_rows(res, torch, sizes, tensors)
    return res
