"""A chain of L dependent f32 GEMVs (4096 x 4096 per layer, y_{l+1} = W_l y_l) on the GPU: one
launch of the persistent kernel (stdlib_kernels.persistent, items wait on stage counters) against
L launches of the stdlib GEMV (gemv_f32_into) captured into one CUDA graph.

Input: none (a CUDA GPU). Output: a markdown table on stdout: us per chain, GB/s of weights
read and % of copy bandwidth, for the graph of GEMVs and for the persistent kernel at several
tile sizes and grids. Method: benchmarks/_timing.replay_seconds (the launches captured once
into a graph, replays timed with CUDA events); L x 64 MiB of weights, well past the 50 MB L2.
Before timing, the persistent chain's output is checked against the GEMV chain's.

    python3 benchmarks/persistent_chain.py [--layers 8] [--n 4096]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks._timing import replay_seconds  # noqa: E402
from benchmarks.quant_matmul import copy_bandwidth  # noqa: E402
from stdlib_kernels._launch import multiprocessors  # noqa: E402
from stdlib_kernels.persistent import ChainRunner, chain_kernel, chain_schedule  # noqa: E402
from stdlib_kernels.persistent import pack_weights  # noqa: E402
from stdlib_kernels.quant.gemv import gemv_f32_into, weight_words  # noqa: E402

TILE_ROWS = (8, 16, 32, 64)
REPLAYS = 10


def gemv_chain(ws, x0):
    """Device weights (word views) and activations y_0..y_L for the stdlib GEMV chain, and the
    function that launches its L GEMVs."""
    n = x0.size
    words = [weight_words(pk.to_device(w.view(np.uint8)), "F32", w.shape[1])[0] for w in ws]
    ys = [pk.to_device(x0)] + [pk.empty(w.shape[0], np.float32) for w in ws]

    def record():
        for layer, w in enumerate(words):
            gemv_f32_into(w, "F32", ys[layer], ys[layer + 1], ws[layer].shape[0], n)
    return record, ys


def check_same(persistent: np.ndarray, graph: np.ndarray, layers: int, n: int):
    """Both chains compute the same sums in different orders: per layer up to ~n eps relative
    to the row's magnitude, compounding over the layers (weights N(0, 1/n): |y| stays O(1))."""
    bound = 4 * layers * n * np.finfo(np.float32).eps * max(1.0, np.abs(graph).max())
    err = np.abs(persistent - graph).max()
    if not err <= bound:
        raise SystemExit(f"persistent chain differs from the GEMV chain: max err {err:.3g} "
                         f"> {bound:.3g}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--n", type=int, default=4096)
    args = parser.parse_args()
    layers, n = args.layers, args.n
    pk.set_device("cuda")
    copy = copy_bandwidth()
    rng = np.random.default_rng(0)
    ws = [(rng.standard_normal((n, n), np.float32) / np.sqrt(n)).astype(np.float32)
          for _ in range(layers)]
    x0 = rng.standard_normal(n).astype(np.float32)
    nbytes = layers * n * n * 4
    print(f"device {pk.current_device().name}, copy bandwidth {copy / 1e9:.0f} GB/s; "
          f"{layers} layers of {n}x{n} f32 ({nbytes / 2**20:.0f} MiB of weights)")
    print("| path | tile rows | grid | us per chain | GB/s | % of copy |")
    print("|---|---|---|---|---|---|")

    def row(label, tile, grid, seconds):
        gbs = nbytes / seconds / 1e9
        print(f"| {label} | {tile} | {grid} | {seconds * 1e6:.1f} | {gbs:.0f} | "
              f"{100 * nbytes / seconds / copy:.1f}% |", flush=True)

    record, ys = gemv_chain(ws, x0)
    row(f"{layers} x gemv_f32_into, CUDA graph", "-", "-", replay_seconds(record, REPLAYS))
    reference = ys[-1].numpy()
    del record, ys
    sms = multiprocessors()
    co_resident = chain_kernel.co_resident_grid(256, ACT=0)
    dims = (n,) * (layers + 1)
    weights = pk.to_device(pack_weights(chain_schedule(dims, TILE_ROWS[0]), ws))  # any tiling
    for tile in TILE_ROWS:
        sched = chain_schedule(dims, tile)
        runner = ChainRunner(sched, weights, "none")
        for grid in sorted({co_resident, sms, 2 * sms}):
            runner.grid = grid
            check_same(runner.run(x0), reference, layers, n)
            row("persistent chain (one launch)", tile, grid, replay_seconds(runner.launch,
                                                                             REPLAYS))
        del runner


if __name__ == "__main__":
    main()
