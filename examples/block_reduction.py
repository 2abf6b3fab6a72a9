"""Row sums with a block reduction: warp shuffles reduce inside each warp, shared memory
combines the warps. One block per row."""
import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32


@pk.func
def warp_sum(v: f32) -> f32:
    for k in pk.static_range(5):          # unrolled: offsets 16, 8, 4, 2, 1
        v += pk.shfl_xor(v, 16 >> k)
    return v


@pk.kernel
def row_sum(x: Ptr[f32, "ro"], out: Ptr[f32], n: i32, BLOCK: Const[int]):
    partial = pk.shared_array(f32, BLOCK // 32)
    t = pk.thread_idx.x
    row = pk.block_idx.x
    acc = f32(0.0)
    for i in range(t, n, BLOCK):
        acc += x[row * n + i]
    acc = warp_sum(acc)
    if pk.lane_id() == 0:
        partial[t // 32] = acc
    pk.syncthreads()
    if t < 32:
        v = partial[t] if t < BLOCK // 32 else f32(0.0)
        v = warp_sum(v)
        if t == 0:
            out[row] = v


def main(rows: int = 300, n: int = 1000):
    x = np.random.default_rng(0).standard_normal((rows, n), np.float32)
    out = pk.empty(rows, np.float32)
    row_sum[rows, 256](pk.to_device(x), out, n, 256)
    np.testing.assert_allclose(out.numpy(), x.sum(axis=1), rtol=1e-4, atol=1e-4)
    print(f"row_sum on {pk.current_device().kind}: {rows} x {n} OK")


if __name__ == "__main__":
    main()
