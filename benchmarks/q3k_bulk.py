"""Q3_K decode GEMV: rows streamed by TMA bulk copies (gemv_q3k_bulk.py) against the register
"wide" kernel, on the GPU, in one run (quant_matmul.py's method: CUDA-graph replays timed with
CUDA events, weight buffers rotated past the 50 MB L2; copy bandwidth = 2 x bytes / time of a
1 GiB copy). Each configuration is timed twice, the rounds alternating.

    python3 benchmarks/q3k_bulk.py [--rounds 2]

Shapes 57344x4096 and 128256x4096 (weights larger than L2: issue 5's 80%-of-copy clause) and
4096x14336. Config = (warps per block, rows per warp) of the bulk kernel; "register" = the
shipped register kernel (TUNED_SHORT / TUNED_CONFIGS).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks.quant_matmul import bench_gemv, copy_bandwidth, default_for  # noqa: E402
from stdlib_kernels.quant.gemv import GemvConfig  # noqa: E402

SHAPES = ((57344, 4096), (128256, 4096), (4096, 14336))
BULK = ((4, 3), (4, 4), (2, 3), (8, 3), (4, 2), (1, 4))   # (warps, rows per warp)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    pk.set_device("cuda")
    copy = copy_bandwidth()
    print(f"device {pk.current_device().name}, copy bandwidth {copy / 1e9:.0f} GB/s")
    rng = np.random.default_rng(0)
    print("| shape | kernel | us per round | best % of copy |")
    print("|---|---|---|---|")
    for shape in SHAPES:
        configs = [("register " + str(tuple(default_for("Q3_K", shape[1]))[:5]),
                    default_for("Q3_K", shape[1]))]
        configs += [(f"bulk {w}w x {r} rows", GemvConfig(warps=w, rows=r, kernel="bulk"))
                    for w, r in BULK]
        times = {label: [] for label, _ in configs}
        for _ in range(args.rounds):
            for label, config in configs:
                seconds, nbytes = bench_gemv("Q3_K", config, rng, shape=shape)
                times[label].append((seconds, nbytes))
        for label, runs in times.items():
            best = min(s for s, _ in runs)
            pct = 100 * runs[0][1] / best / copy
            us = ", ".join(f"{s * 1e6:.2f}" for s, _ in runs)
            print(f"| {shape[0]}x{shape[1]} | {label} | {us} | {pct:.1f}% |", flush=True)


if __name__ == "__main__":
    main()
