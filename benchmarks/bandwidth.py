"""Memory bandwidth of pykernel kernels on the GPU: f32 vector add with one element per thread
(scalar loads) vs four per thread with 16-byte vector loads (pk.load_vec), the same add and an
inverted dropout (pk.rand per element) as `@pk.elementwise` operations (and the add broadcast:
a 256 MiB matrix plus a row bias or a column), a `@pk.reduction` sum,
and a plain copy.
Buffers of 256 MiB each (far above the 50-60 MB L2), CUDA-event timing over 20 launches.
Bytes counted: reads + writes. Usage: python benchmarks/bandwidth.py"""
import numpy as np

import pykernel as pk
from pykernel import Ptr, f32, i32


@pk.kernel
def add_scalar(a: Ptr[f32, "ro"], b: Ptr[f32, "ro"], out: Ptr[f32], n: i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        out[i] = a[i] + b[i]


@pk.kernel
def add_vec4(a: Ptr[f32, "ro"], b: Ptr[f32, "ro"], out: Ptr[f32], n4: i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n4:
        a0, a1, a2, a3 = pk.load_vec(a, 4 * i, 4)
        b0, b1, b2, b3 = pk.load_vec(b, 4 * i, 4)
        pk.store_vec(out, 4 * i, (a0 + b0, a1 + b1, a2 + b2, a3 + b3))


@pk.elementwise
def add_elementwise(a: f32, b: f32) -> f32:
    return a + b


@pk.elementwise
def dropout_elementwise(a: f32, index: i32, seed: i32) -> f32:
    return a * f32(2.0) if pk.rand(seed, index) >= f32(0.5) else f32(0.0)


@pk.reduction(identity=0.0)
def sum_reduction(a: f32, b: f32) -> f32:
    return a + b


@pk.kernel
def copy_vec4(a: Ptr[f32, "ro"], out: Ptr[f32], n4: i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n4:
        pk.store_vec(out, 4 * i, pk.load_vec(a, 4 * i, 4))


def timed(fn, repeats=20):
    fn()
    start, stop = pk.Event(), pk.Event()
    start.record()
    for _ in range(repeats):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_ms(stop) / repeats * 1e-3


def main():
    pk.set_device("cuda")
    n = 64 * 1024 * 1024                     # 256 MiB per f32 buffer
    a, b = pk.full(n, 1.0, np.float32), pk.full(n, 2.0, np.float32)
    out = pk.empty(n, np.float32)
    rows = []
    t = timed(lambda: add_scalar[n // 256, 256](a, b, out, n))
    rows.append(("vector add, scalar (1 elem/thread)", 12 * n / t))
    t = timed(lambda: add_vec4[n // 4 // 256, 256](a, b, out, n // 4))
    rows.append(("vector add, 16-byte vector loads", 12 * n / t))
    assert float(out.numpy()[12345]) == 3.0
    out.copy_from(np.zeros(n, np.float32))
    t = timed(lambda: add_elementwise(a, b, out=out))
    rows.append(("vector add, @pk.elementwise (4-wide vector loads, 64-bit grid-stride)",
                 12 * n / t))
    assert float(out.numpy()[12345]) == 3.0
    matrix = out.reshape(16384, 4096)             # 256 MiB as rows x columns
    bias, column = pk.full(4096, 2.0, np.float32), pk.full((16384, 1), 2.0, np.float32)
    for label, other in (("row bias", bias), ("column", column)):
        t = timed(lambda: add_elementwise(a.reshape(16384, 4096), other, out=matrix))
        rows.append((f"matrix + {label}, @pk.elementwise broadcast kernel", 8 * n / t))
    assert float(matrix.numpy()[5, 7]) == 3.0
    index = pk.to_device(np.arange(n, dtype=np.int32))
    t = timed(lambda: dropout_elementwise(a, index, 7, out=out))
    rows.append(("dropout, @pk.elementwise with pk.rand (Philox per element; reads a, index)",
                 12 * n / t))
    assert abs(float(np.mean(out.numpy() == 0)) - 0.5) < 0.01
    total = pk.empty((), np.float32)
    t = timed(lambda: sum_reduction(a, out=total))
    rows.append(("sum, @pk.reduction (reads only; two launches)", 4 * n / t))
    assert float(total.numpy()) == float(n)
    for rows_, cols in ((16384, 4096), (n // 64, 64)):      # a block per row; a warp per row
        sums = pk.empty(rows_, np.float32)
        t = timed(lambda: sum_reduction(a.reshape(rows_, cols), out=sums, axis=-1))
        rows.append((f"row sums {rows_} x {cols}, @pk.reduction axis=-1 (reads only)",
                     4 * n / t))
        assert float(sums.numpy()[3]) == float(cols)
    t = timed(lambda: copy_vec4[n // 4 // 256, 256](a, out, n // 4))
    rows.append(("copy, 16-byte vector loads", 8 * n / t))
    try:
        import torch
        x = torch.empty(n, dtype=torch.float32, device="cuda")
        y = torch.empty_like(x)
        t = timed(lambda: y.copy_(x))
        rows.append(("torch device-to-device copy (reference)", 8 * n / t))
    except Exception:
        pass
    print(f"device: {pk.current_device().name}")
    print("| kernel | TB/s |\n|---|---|")
    for name, bw in rows:
        print(f"| {name} | {bw / 1e12:.2f} |")


if __name__ == "__main__":
    main()
