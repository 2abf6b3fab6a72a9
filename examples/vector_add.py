"""Vector add: the smallest pykernel program. Runs on the GPU when one is usable, otherwise on
the CPU target: `python examples/vector_add.py` (PYKERNEL_DEVICE=cpu forces the CPU)."""
import numpy as np

import pykernel as pk
from pykernel import Ptr, f32, i32


@pk.kernel
def vector_add(a: Ptr[f32, "ro"], b: Ptr[f32, "ro"], out: Ptr[f32], n: i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        out[i] = a[i] + b[i]


def main(n: int = 1_000_003):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
    out = pk.empty(n, np.float32)
    vector_add[(n + 255) // 256, 256](pk.to_device(a), pk.to_device(b), out, n)
    assert np.array_equal(out.numpy(), a + b)
    print(f"vector_add on {pk.current_device().kind}: {n} elements OK")


if __name__ == "__main__":
    main()
