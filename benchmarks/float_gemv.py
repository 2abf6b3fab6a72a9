"""Decode GEMV on F32 / F16 / BF16 weights (float32 activations, gemv_f32_into), on the GPU:
the shipped path (F16/BF16 rows read as 16-byte words, decode8.decode8_halves) against the
previous u16 loads, and launch shapes. quant_matmul.py's method: CUDA-graph replays timed with
CUDA events, weights larger than the 50 MB L2 (or rotated past it); copy bandwidth = 2 x bytes
/ time of a 1 GiB copy. Each configuration timed twice, rounds alternating.

    python3 benchmarks/float_gemv.py
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks._timing import replay_seconds  # noqa: E402
from benchmarks.quant_matmul import (L2_BYTES, copy_bandwidth, gemv_module,  # noqa: E402
                                     random_weights, round_cells)
from stdlib_kernels.quant.gemv import GemvConfig, gemv_f32_into  # noqa: E402

SHAPES = {"F16": ((57344, 4096), (128256, 4096), (4096, 14336)),
          "BF16": ((57344, 4096), (4096, 14336)),
          "F32": ((57344, 4096), (4096, 14336))}
CONFIGS = (GemvConfig(4, 4, 1, 1), GemvConfig(4, 2, 1, 1), GemvConfig(8, 4, 1, 1),
           GemvConfig(8, 8, 1, 1), GemvConfig(4, 1, 1, 1))


def bench(type_name, shape, config, rng, words=True) -> tuple[float, int]:
    m, k = shape
    itemsize = 4 if type_name == "F32" else 2
    nbytes = m * k * itemsize
    weights, _ = random_weights(type_name, m, k, -(-4 * L2_BYTES // nbytes), rng)
    x = pk.to_device(rng.standard_normal((1, k)).astype(np.float32))
    y = pk.empty((1, m), np.float32)
    reps = max(4, 8 * len(weights))
    saved = gemv_module.HALF_WORDS
    if not words:
        gemv_module.HALF_WORDS = {}

    def run():
        for r in range(reps):
            gemv_f32_into(weights[r % len(weights)], type_name, x, y, m, k, config=config)
    try:
        return replay_seconds(run, 5) / reps, nbytes
    finally:
        gemv_module.HALF_WORDS = saved


def main():
    pk.set_device("cuda")
    copy = copy_bandwidth()
    print(f"device {pk.current_device().name}, copy bandwidth {copy / 1e9:.0f} GB/s")
    print("| type | shape | path, config (warps, split) | us, two rounds | % of copy |")
    print("|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for type_name, shapes in SHAPES.items():
        for shape in shapes:
            variants = [(f"words {c.warps},{c.split}", c, True) for c in CONFIGS]
            if type_name != "F32":
                variants.insert(0, ("u16 loads 4,4", CONFIGS[0], False))
            times = {label: [] for label, _, _ in variants}
            for _ in range(2):
                for label, config, words in variants:
                    times[label].append(bench(type_name, shape, config, rng, words))
            for label, runs in times.items():
                us, pct = round_cells(runs, copy)
                print(f"| {type_name} | {shape[0]}x{shape[1]} | {label} | {us} | {pct:.1f}% |",
                      flush=True)


if __name__ == "__main__":
    main()
