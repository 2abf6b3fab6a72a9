"""Autotuning: the tiled matmul of tiled_matmul.py, its tile size chosen by measurement.

`@pk.autotune` times each configuration on the first call for a new key (here the matrix
shape) and launches the fastest from then on; `launch` turns a configuration into the grid
and block. `verbose=True` prints each configuration's time.
"""
import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32


def tiles(args, config):
    """(grid, block) of a launch with TILE x TILE threads per block."""
    t = config["TILE"]
    return ((args["n"] + t - 1) // t, (args["m"] + t - 1) // t), (t, t)


@pk.autotune(configs=[{"TILE": 8}, {"TILE": 16}, {"TILE": 32}], key=["m", "n", "k"],
             launch=tiles)
@pk.kernel
def matmul(a: Ptr[f32, "ro"], b: Ptr[f32, "ro"], c: Ptr[f32], m: i32, n: i32, k: i32,
           TILE: Const[int]):
    sa = pk.shared_array(f32, (TILE, TILE))
    sb = pk.shared_array(f32, (TILE, TILE + 1))
    tx, ty = pk.thread_idx.x, pk.thread_idx.y
    row = pk.block_idx.y * TILE + ty
    col = pk.block_idx.x * TILE + tx
    acc = f32(0.0)
    for k0 in range(0, k, TILE):
        sa[ty, tx] = a[row * k + k0 + tx] if row < m and k0 + tx < k else f32(0.0)
        sb[ty, tx] = b[(k0 + ty) * n + col] if k0 + ty < k and col < n else f32(0.0)
        pk.syncthreads()
        for kk in pk.static_range(TILE):
            acc += sa[ty, kk] * sb[kk, tx]
        pk.syncthreads()
    if row < m and col < n:
        c[row * n + col] = acc


def main(m: int = 96, n: int = 80, k: int = 64):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    c = pk.full((m, n), np.nan, np.float32)
    matmul(pk.to_device(a), pk.to_device(b), c, m, n, k)      # tunes, then launches the best
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4, atol=1e-4)
    chosen = matmul.best_config(pk.to_device(a), pk.to_device(b), c, m, n, k)
    print(f"autotuned matmul on {pk.current_device().kind}: TILE={chosen['TILE']} OK")


if __name__ == "__main__":
    main()
