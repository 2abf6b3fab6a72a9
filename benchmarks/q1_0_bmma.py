"""Q1_0 decode GEMV: binary tensor cores (gemv_q1_0.py) against the DP4A "rows" kernel, on the
GPU, in one run (quant_matmul.py's method: CUDA-graph replays timed with CUDA events, weight
buffers rotated past the 50 MB L2, copy bandwidth = 2 x bytes / time of a 1 GiB copy).

    python3 benchmarks/q1_0_bmma.py [--tries]      (or quant_matmul.py --q1-0-bmma)

Shapes 57344x4096, 128256x4096 (weights larger than L2) and 4096x14336 (issue 5's, llama.cpp
10.5 us with its Q8_1 quantization). Each row: the GEMV alone and with its activation
quantization launch in the same graph (Q8_1 for "rows", Q8 planes for BMMA). --tries also
times the BMMA launch shapes in TRIES. Output: a markdown table; JSON at $OUT/q1_0_bmma.json.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks.quant_matmul import (BIG, LONG, MID, bench_gemv, copy_bandwidth,  # noqa: E402
                                     default_for, random_weights, time_graph)
from stdlib_kernels.quant.gemv_q1_0 import Q1Config as Q, gemv_q1_0_into, q1_0_config  # noqa
from stdlib_kernels.quant.q8_planes import q8_planes_bytes, quantize_q8_planes_into  # noqa

TRIES = {4096: (Q(4, 1, 1, 4, 1), Q(4, 1, 1, 4, 0), Q(8, 1, 1, 1, 1), Q(2, 1, 1, 1, 1),
                Q(4, 1, 2, 1, 1), Q(4, 2, 1, 1, 1), Q(1, 1, 1, 1, 1)),
         14336: (Q(8, 8, 1, 2, 1), Q(7, 7, 1, 1, 1), Q(4, 4, 1, 1, 1), Q(8, 4, 1, 1, 1),
                 Q(16, 16, 1, 1, 0), Q(8, 8, 1, 1, 0), Q(4, 2, 1, 1, 1), Q(4, 4, 2, 1, 1))}


def bench_bmma(config, rng, shape, batch=1, with_quantize=False):
    """Seconds per BMMA GEMV (plus the planes quantization when with_quantize), weight bytes."""
    m, k = shape
    weights, nbytes = random_weights("Q1_0", m, k, 0, rng)
    weights, nbytes = random_weights("Q1_0", m, k, -(-4 * (50 << 20) // nbytes), rng)
    x = pk.to_device(rng.standard_normal((batch, k)).astype(np.float32))
    xp = pk.empty((batch, q8_planes_bytes(k)), np.uint8)
    quantize_q8_planes_into(x, xp)
    y = pk.empty((batch, m), np.float32)
    reps = max(4, 8 * len(weights))

    def run(stream):
        for r in range(reps):
            if with_quantize:
                quantize_q8_planes_into(x, xp, stream=stream)
            gemv_q1_0_into(weights[r % len(weights)], xp, y, m, k, batch, stream=stream,
                           config=config)
    return time_graph(run) / reps, nbytes


def row(results, copy, label, shape, config, alone, both, nbytes):
    gbps = nbytes / alone / 1e9
    results["rows"].append(dict(kernel=label, m=shape[0], k=shape[1], config=tuple(config),
                                us=alone * 1e6, GBps=gbps, with_quantize_us=both * 1e6))
    print(f"| {label} | {shape[0]}x{shape[1]} | {tuple(config)} | {alone * 1e6:.2f} | "
          f"{gbps:.0f} | {100 * gbps / copy:.0f} | {both * 1e6:.2f} | "
          f"{100 * nbytes / both / 1e9 / copy:.0f} |", flush=True)


def main():
    pk.set_device("cuda")
    rng = np.random.default_rng(0)
    copy = copy_bandwidth() / 1e9
    results = {"copy_GBps": copy, "rows": []}
    print(f"copy bandwidth: {copy:.0f} GB/s; device {pk.current_device().name}")
    print("\n| kernel | m x k | config | us | GB/s | % copy | + quantize us | + quantize % copy |"
          "\n|---|---|---|---|---|---|---|---|")
    for shape in (MID, BIG, LONG):
        k = shape[1]
        old = default_for("Q1_0", k)
        alone, nbytes = bench_gemv("Q1_0", old, rng, shape=shape)
        both, _ = bench_gemv("Q1_0", old, rng, shape=shape, with_quantize=True)
        row(results, copy, "rows (DP4A, Q8_1)", shape, old, alone, both, nbytes)
        configs = [q1_0_config(k)]
        if "--tries" in sys.argv:
            configs += [c for c in TRIES[4096 if k <= 8192 else 14336] if c != configs[0]]
        for config in configs:
            try:
                alone, nbytes = bench_bmma(config, rng, shape)
                both, _ = bench_bmma(config, rng, shape, with_quantize=True)
            except ValueError as e:    # a launch shape over the shared-memory limit
                print(f"| BMMA | {shape[0]}x{shape[1]} | {tuple(config)} | {e} |")
                continue
            row(results, copy, "BMMA (Q8 planes)", shape, config, alone, both, nbytes)
        save(results)
    print("\nbatched, 4096x14336, default config (us, GEMV alone):")
    for batch in (2, 8):
        sec, _ = bench_bmma(q1_0_config(LONG[1]), rng, LONG, batch=batch)
        results["rows"].append(dict(kernel="BMMA", batch=batch, us=sec * 1e6))
        print(f"  BMMA batch {batch}: {sec * 1e6:.2f} us", flush=True)
    save(results)


def save(results):
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "q1_0_bmma.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
