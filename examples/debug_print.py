"""print() inside a kernel, for debugging: each thread that reaches the call writes one line.
On the GPU the lines appear at the next `pk.synchronize()`, in whatever order the threads ran;
on the CPU target (PYKERNEL_DEVICE=cpu) in thread order. `python examples/debug_print.py`."""
import numpy as np

import pykernel as pk
from pykernel import Ptr, f32, i32


@pk.kernel
def find_outliers(x: Ptr[f32, "ro"], limit: f32, count: Ptr[i32], n: i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n and abs(x[i]) > limit:
        print(f"block {pk.block_idx.x:3d} thread {pk.thread_idx.x:3d}: x[{i}] = {x[i]:+.4e}")
        pk.atomic_add(count, 0, 1)


def main(n: int = 10_000):
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    x[[17, 4242, 9001]] = [40.0, -1.0e6, 3.5e3]
    count = pk.zeros(1, np.int32)
    find_outliers[(n + 255) // 256, 256](pk.to_device(x), 10.0, count, n)
    pk.synchronize()                       # the GPU's lines are written here
    assert int(count.numpy()[0]) == int((np.abs(x) > 10.0).sum()) == 3
    print(f"debug_print on {pk.current_device().kind}: 3 outliers OK")


if __name__ == "__main__":
    main()
