"""AOT example: `pykernel build examples/aot_build.py --arch sm_80 --arch sm_90
--const BLOCK=256 -o build/ptx` writes one .ptx per kernel and arch, manifest.json describing
each entry's parameters, and kernels.h with C launch helpers for the CUDA driver API."""
import pykernel as pk
from pykernel import Const, Ptr, f32, i32


@pk.kernel
def scale(x: Ptr[f32, "ro"], out: Ptr[f32], n: i32, alpha: f32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        out[i] = alpha * x[i]


@pk.kernel
def row_sum(x: Ptr[f32, "ro"], out: Ptr[f32], n: i32, BLOCK: Const[int]):
    buf = pk.shared_array(f32, BLOCK)
    t = pk.thread_idx.x
    acc = f32(0.0)
    for i in range(t, n, BLOCK):
        acc += x[pk.block_idx.x * n + i]
    buf[t] = acc
    pk.syncthreads()
    s = BLOCK // 2
    while s > 0:
        if t < s:
            buf[t] += buf[t + s]
        pk.syncthreads()
        s //= 2
    if t == 0:
        out[pk.block_idx.x] = buf[0]
