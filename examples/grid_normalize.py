"""A constant-memory table and a grid-wide barrier in one kernel: every element goes through a
polynomial whose coefficients live in constant memory (`pk.const_array`: `ld.const`), then the
grid meets (`pk.grid_sync()`, a cooperative launch) and every element is divided by the sum
over the whole array. `python examples/grid_normalize.py` (PYKERNEL_DEVICE=cpu for the CPU)."""
import numpy as np

import pykernel as pk
from pykernel import Ptr, f32, i32

COEFFS = pk.const_array([0.5, -1.25, 2.0, 0.75], pk.f32)     # c0 + c1 x + c2 x^2 + c3 x^3
BLOCK = 128


@pk.kernel
def poly_normalize(x: Ptr[f32, "ro"], partial: Ptr[f32], out: Ptr[f32], n: i32):
    t, b = pk.thread_idx.x, pk.block_idx.x
    sums = pk.shared_array(f32, BLOCK)
    y = f32(0.0)
    for i in range(b * BLOCK + t, n, pk.grid_dim.x * BLOCK):     # a grid-stride loop
        v = x[i]
        p = COEFFS[3]
        for k in pk.static_range(3):
            p = p * v + COEFFS[2 - k]                          # Horner
        out[i] = p
        y += p
    sums[t] = y
    pk.syncthreads()
    if t == 0:
        s = f32(0.0)
        for k in range(BLOCK):
            s += sums[k]
        partial[b] = s
    pk.grid_sync()                     # every block's partial sum is written and visible
    total = f32(0.0)
    for k in range(pk.grid_dim.x):
        total += partial[k]
    for i in range(b * BLOCK + t, n, pk.grid_dim.x * BLOCK):
        out[i] = out[i] / total


def main(n: int = 100_003, blocks: int = 8):
    x = np.random.default_rng(0).random(n, np.float32)
    out, partial = pk.full(n, np.nan, np.float32), pk.full(blocks, np.nan, np.float32)
    poly_normalize[blocks, BLOCK](pk.to_device(x), partial, out, n)
    y = np.polynomial.polynomial.polyval(x.astype(np.float64), [0.5, -1.25, 2.0, 0.75])
    np.testing.assert_allclose(out.numpy(), y / y.sum(), rtol=1e-4)
    print(f"grid_normalize on {pk.current_device().kind}: {n} elements, {blocks} blocks OK")


if __name__ == "__main__":
    main()
