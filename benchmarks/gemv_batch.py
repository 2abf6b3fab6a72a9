"""Batched decode GEMVs (2..8 tokens, what `serve --parallel N` runs per step): the register
DP4A kernel's batch configs (gemv.BATCH_CONFIGS) against the bulk-copy kernel (gemv_bulk.py)
at the llama-8B Q4_K_M file's shapes, on the GPU. Same method as quant_matmul.py (CUDA-graph
replays timed with CUDA events, weight buffers rotated past the 50 MB L2; copy bandwidth =
2 x bytes / time of a 1 GiB copy). "% of copy" = weight bytes / time / copy bandwidth: the
tokens share one read of the weights, so a batch's ideal time is one token's.

    python3 benchmarks/gemv_batch.py [--types Q4_K,Q6_K] [--batches 1,2,4,8] [--rounds 2]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks.quant_matmul import bench_gemv, copy_bandwidth, round_cells  # noqa: E402
from stdlib_kernels.quant.gemv import GemvConfig, gemv_config  # noqa: E402
from stdlib_kernels.quant.gemv_bulk import LONG_ROW  # noqa: E402

# llama-8B Q4_K_M: gate|up (as one matrix), q|k, o, down (Q4_K layers); down (Q6_K layers),
# v, output
SHAPES = {"Q4_K": ((28672, 4096), (5120, 4096), (4096, 4096), (4096, 14336)),
          "Q6_K": ((4096, 14336), (1024, 4096), (128256, 4096)),
          "Q8_0": ((28672, 4096), (4096, 14336))}
# bulk (warps per block, rows per warp[, warps per row for rows over LONG_ROW])
BULK = ((4, 1), (4, 2), (8, 1), (4, 4), (2, 2))
SPLITS = ((4, 1, 4), (8, 1, 4), (8, 1, 8))


def configs(type_name: str, batch: int, k: int):
    register = gemv_config(type_name, batch, k)
    yield f"register {tuple(register)[:5]} {register.kernel or 'base'}", register
    for w, r, *split in BULK + (SPLITS if k > LONG_ROW else ()):
        yield (f"bulk {w}w x {r} rows" + (f" / {split[0]} warps per row" if split else ""),
               GemvConfig(warps=w, rows=r, kernel="bulk", split=split[0] if split else 1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="Q4_K,Q6_K")
    parser.add_argument("--batches", default="1,2,4,8")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    pk.set_device("cuda")
    copy = copy_bandwidth()
    print(f"device {pk.current_device().name}, copy bandwidth {copy / 1e9:.0f} GB/s")
    rng = np.random.default_rng(0)
    print("| type | shape | batch | kernel | us per round | best % of copy |")
    print("|---|---|---|---|---|---|")
    for type_name in args.types.split(","):
        for m, k in SHAPES[type_name]:
            for batch in (int(b) for b in args.batches.split(",")):
                runs = {label: [] for label, _ in configs(type_name, batch, k)}
                for _ in range(args.rounds):
                    for label, config in configs(type_name, batch, k):
                        if batch == 1 and label.startswith("register"):
                            config = None        # one token: the shipped default routing
                        try:
                            runs[label].append(bench_gemv(type_name, config, rng, batch=batch,
                                                          shape=(m, k), pdl=True))
                        except (pk.LaunchError, ValueError) as exc:
                            runs[label].append(None)
                            print(f"<!-- {label}: {exc} -->")
                for label, times in runs.items():
                    times = [t for t in times if t]
                    if not times:
                        continue
                    us, pct = round_cells(times, copy)
                    print(f"| {type_name} | {m}x{k} | {batch} | {label} | {us} | {pct:.0f}% |",
                          flush=True)


if __name__ == "__main__":
    main()
