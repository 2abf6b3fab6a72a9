"""Decode GEMV (Q3_K / Q4_K / Q5_K / Q6_K / Q8_0): rows streamed by TMA bulk copies
(stdlib_kernels/quant/gemv_bulk.py) against the register kernels, on the GPU, in one run
(quant_matmul.py's method: CUDA-graph replays timed with CUDA events, weight buffers rotated
past the 50 MB L2; copy bandwidth = 2 x bytes / time of a 1 GiB copy). Each configuration is
timed `--rounds` times, the rounds alternating; `--pdl` also times each in a PDL graph (the
runner's decode graph: the bulk kernel issues its copies before waiting for the previous GEMV).

    python3 benchmarks/gemv_bulk.py [--types Q3_K,Q4_K,Q6_K] [--rounds 2] [--pdl]

Shapes: Q3_K 57344x4096 and 128256x4096 (weights over L2: issue 5's 80%-of-copy clause) and
4096x14336; Q4_K and Q5_K the llama-8B shapes (gate / up, q + k + v, o, down, output), Q5_K
also qwen2-1.5B's; Q6_K 4096x14336 (llama-8B's ffn_down), 4096x12288 (8B-class ffn_down) and
128256x4096 (llama-8B's output). Config = (warps per block, rows per warp, ring stages) of the
bulk kernel, and for rows over 8192 values the row split over warps (gemv_bulk_split);
"register" = the shipped register kernel (TUNED_SHORT / TUNED_CONFIGS).
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
from stdlib_kernels.quant.gemv_bulk import UNIT_BLOCKS  # noqa: E402

SHAPES = {"Q3_K": ((57344, 4096), (128256, 4096), (4096, 14336)),
          "Q4_K": ((14336, 4096), (6144, 4096), (4096, 4096), (4096, 14336), (128256, 4096)),
          "Q8_0": ((14336, 4096), (6144, 4096), (4096, 4096), (4096, 14336), (128256, 4096)),
          "Q5_K": ((14336, 4096), (6144, 4096), (4096, 4096), (4096, 14336), (128256, 4096),
                   (8960, 1536), (2048, 1536), (1536, 1536), (1536, 8960)),
          "Q6_K": ((4096, 14336), (4096, 12288), (128256, 4096))}
# (warps per block, rows per warp, ring stages[, warps per row: gemv_bulk_split])
BULK = {"Q3_K": ((4, 3, 1), (4, 4, 1), (2, 3, 1), (4, 3, 2), (2, 3, 2), (1, 4, 4)),
        "Q4_K": ((4, 1, 1), (4, 2, 1), (4, 4, 1), (8, 2, 1), (2, 2, 1), (4, 2, 2)),
        "Q5_K": ((4, 1, 1), (4, 2, 1), (8, 1, 1), (8, 2, 1), (2, 2, 1), (4, 2, 2)),
        "Q8_0": ((4, 1, 1), (4, 2, 1), (8, 1, 1), (2, 1, 1), (4, 2, 2)),
        "Q6_K": ((4, 1, 1), (4, 2, 1), (8, 1, 1), (4, 1, 2), (2, 1, 2), (2, 1, 3), (1, 1, 4),
                 (4, 1, 3), (8, 1, 2), (1, 2, 2), (2, 2, 2))}
# long rows (k > 8192) also split over warps
SPLITS = ((2, 1, 1, 2), (4, 1, 1, 2), (8, 1, 1, 2), (4, 1, 1, 4), (8, 1, 1, 4), (7, 1, 1, 7),
          (8, 1, 1, 8))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="Q3_K,Q4_K,Q6_K")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pdl", action="store_true")
    parser.add_argument("--shapes", default="", help="only these, e.g. 4096x14336,14336x4096")
    args = parser.parse_args()
    pk.set_device("cuda")
    copy = copy_bandwidth()
    print(f"device {pk.current_device().name}, copy bandwidth {copy / 1e9:.0f} GB/s")
    rng = np.random.default_rng(0)
    modes = (False, True) if args.pdl else (False,)
    print("| shape | kernel | graph | us per round | best % of copy |")
    print("|---|---|---|---|---|")
    for type_name in args.types.split(","):
        for shape in SHAPES[type_name]:
            if args.shapes and f"{shape[0]}x{shape[1]}" not in args.shapes.split(","):
                continue
            register = default_for(type_name, shape[1])
            configs = [(f"{type_name} register " + str(tuple(register)[:5]), register)]
            units = shape[1] // 256 // UNIT_BLOCKS[type_name]
            shapes = BULK[type_name] + (SPLITS if shape[1] > 8192 else ())
            configs += [(f"{type_name} bulk {w}w x {r} rows x {s} stages"
                         + (f" x {c[0]} warps per row" if c else ""),
                         GemvConfig(warps=w, rows=r, kernel="bulk", stages=s,
                                    split=c[0] if c else 1))
                        for w, r, s, *c in shapes if not c or c[0] <= units]
            for pdl in modes:
                times = {label: [] for label, _ in configs}
                for _ in range(args.rounds):
                    for label, config in configs:
                        if label not in times:
                            continue
                        try:
                            times[label].append(bench_gemv(type_name, config, rng,
                                                           shape=shape, pdl=pdl))
                        except pk.LaunchError as exc:      # rows too long for the stages
                            print(f"| {shape[0]}x{shape[1]} | {label} | does not fit: "
                                  f"{exc} |", flush=True)
                            del times[label]
                for label, runs in times.items():
                    best = min(s for s, _ in runs)
                    pct = 100 * runs[0][1] / best / copy
                    us = ", ".join(f"{s * 1e6:.2f}" for s, _ in runs)
                    print(f"| {shape[0]}x{shape[1]} | {label} | {'PDL' if pdl else 'plain'} | "
                          f"{us} | {pct:.1f}% |", flush=True)


if __name__ == "__main__":
    main()
