"""Numerically stable row softmax: max and sum reductions with warp shuffles, one warp per
row, exp from pykernel's accurate math library."""
import numpy as np

import pykernel as pk
from pykernel import Ptr, f32, i32


@pk.kernel
def softmax_rows(x: Ptr[f32, "ro"], out: Ptr[f32], rows: i32, n: i32):
    row = pk.block_idx.x
    lane = pk.lane_id()
    m = f32(-3.0e38)
    for i in range(lane, n, 32):
        m = max(m, x[row * n + i])
    for k in pk.static_range(5):
        m = max(m, pk.shfl_xor(m, 16 >> k))
    s = f32(0.0)
    for i in range(lane, n, 32):
        s += pk.exp(x[row * n + i] - m)
    for k in pk.static_range(5):
        s += pk.shfl_xor(s, 16 >> k)
    inv = 1.0 / s
    for i in range(lane, n, 32):
        out[row * n + i] = pk.exp(x[row * n + i] - m) * inv


def main(rows: int = 64, n: int = 1000):
    x = (np.random.default_rng(0).standard_normal((rows, n)) * 4).astype(np.float32)
    out = pk.empty((rows, n), np.float32)
    softmax_rows[rows, 32](pk.to_device(x), out, rows, n)
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
    print(f"softmax on {pk.current_device().kind}: {rows} x {n} OK")


if __name__ == "__main__":
    main()
