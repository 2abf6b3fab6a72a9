"""Autotuning: the tiled matmul of tiled_matmul.py, its tile size chosen by measurement.

`@pk.autotune` times each configuration on the first call for a new key (here the matrix
shape) and launches the fastest from then on; `launch` turns a configuration into the grid
and block. `verbose=True` prints each configuration's time.
"""
import os
import sys

import numpy as np

import pykernel as pk

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiled_matmul import matmul as tiled_matmul  # noqa: E402


def tiles(args, config):
    """(grid, block) of a launch with TILE x TILE threads per block."""
    t = config["TILE"]
    return ((args["n"] + t - 1) // t, (args["m"] + t - 1) // t), (t, t)


# the kernel of tiled_matmul.py, its TILE now chosen per shape by measurement
matmul = pk.autotune(configs=[{"TILE": 8}, {"TILE": 16}, {"TILE": 32}], key=["m", "n", "k"],
                     launch=tiles)(tiled_matmul)


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
