"""One kernel body, two element types: a `T: Const[pk.dtype]` parameter monomorphises the
kernel per dtype (like cuda-oxide's generic kernels). Each dtype compiles once and is cached."""
import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32


@pk.kernel
def axpby(x: Ptr["T", "ro"], y: Ptr["T"], n: i32, a: f32, b: f32, T: Const[pk.dtype]):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        y[i] = T(a * f32(x[i]) + b * f32(y[i]))     # compute in f32, store as T


def main(n: int = 10_000):
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float16):
        x, y = rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)
        dy = pk.to_device(y)
        axpby[(n + 255) // 256, 256](pk.to_device(x), dy, n, 2.0, -1.0, dtype)
        want = (2 * x.astype(np.float32) - y.astype(np.float32)).astype(dtype)
        assert np.array_equal(dy.numpy(), want), dtype
        print(f"axpby[{np.dtype(dtype).name}] on {pk.current_device().kind} OK")


if __name__ == "__main__":
    main()
