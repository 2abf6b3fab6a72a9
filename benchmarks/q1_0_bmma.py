"""Q1_0 decode GEMV: binary tensor cores (gemv_q1_0.py) against the DP4A "rows" kernel, on the
GPU, in one run (quant_matmul.py's method: CUDA-graph replays timed with CUDA events, weight
buffers rotated past the 50 MB L2, copy bandwidth = 2 x bytes / time of a 1 GiB copy).

    python3 benchmarks/q1_0_bmma.py [--tries]      (or quant_matmul.py --q1-0-bmma)
    python3 benchmarks/q1_0_bmma.py --bulk         the default against the bulk-copy rings

Shapes 57344x4096, 128256x4096 (weights larger than L2) and 4096x14336 (issue 5's, llama.cpp
10.5 us with its Q8_1 quantization). Each row: the GEMV alone and with its activation
quantization launch in the same graph (Q8_1 for "rows", Q8 planes for BMMA), fragments loaded
straight from the rows (DIRECT) next to the shipped cp.async ring. --tries also times the BMMA
launch shapes in TRIES (GEMV alone). Then batch 2 and 8, and the swiglu (gate + up) mode.
Output: markdown tables; JSON at $OUT/q1_0_bmma.json.
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

DIRECT = {4096: Q(4, 1, 1, 4, 0), 14336: Q(8, 8, 1, 2, 0)}   # no shared-memory ring
TRIES = {4096: (Q(2, 1, 1, 1, 2), Q(1, 1, 1, 1, 2), Q(8, 1, 1, 1, 2), Q(4, 1, 1, 1, 3),
                Q(2, 1, 1, 1, 3), Q(4, 2, 1, 1, 2), Q(4, 2, 1, 1, 3), Q(4, 1, 1, 1, 4)),
         14336: (Q(7, 7, 1, 1, 2), Q(8, 8, 1, 1, 2), Q(14, 14, 1, 1, 3), Q(16, 16, 1, 1, 2),
                 Q(8, 8, 1, 1, 3), Q(8, 8, 1, 2, 0))}


# bulk-copy rings (Q1Config.bulk = blocks per chunk): --bulk times them against the default
BULK = {4096: (Q(4, 1, 1, 1, 2, 0), Q(2, 1, 1, 1, 1, 32), Q(1, 1, 1, 1, 1, 32),
               Q(3, 1, 1, 1, 1, 32), Q(1, 1, 1, 1, 2, 32), Q(2, 1, 1, 1, 1, 16),
               Q(1, 1, 1, 1, 1, 16), Q(2, 1, 1, 1, 2, 16), Q(1, 1, 1, 1, 3, 16)),
        14336: (Q(14, 14, 1, 1, 2, 8), Q(7, 7, 1, 1, 1, 16))}


def bench_bmma(config, rng, shape, batch=1, with_quantize=False, glu=False):
    """Seconds per BMMA GEMV (plus the planes quantization when with_quantize; glu: swiglu of
    two matrices), weight bytes."""
    m, k = shape
    weights, nbytes = random_weights("Q1_0", m, k, 0, rng)
    weights, nbytes = random_weights("Q1_0", m, k, -(-4 * (50 << 20) // nbytes), rng)
    nbytes *= 2 if glu else 1
    x = pk.to_device(rng.standard_normal((batch, k)).astype(np.float32))
    xp = pk.empty((batch, q8_planes_bytes(k)), np.uint8)
    quantize_q8_planes_into(x, xp)
    y = pk.empty((batch, m), np.float32)
    reps = max(4, 8 * len(weights))

    def run(stream):
        for r in range(reps):
            if with_quantize:
                quantize_q8_planes_into(x, xp, stream=stream)
            w2 = weights[(r + 1) % len(weights)] if glu else None
            gemv_q1_0_into(weights[r % len(weights)], xp, y, m, k, batch, stream=stream,
                           config=config, w2=w2, mode="swiglu" if glu else None)
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
        key = 4096 if k <= 8192 else 14336
        default = q1_0_config(k, rows=shape[0])
        for label, config in (("BMMA direct", DIRECT[key]), ("BMMA default", default)):
            alone, nbytes = bench_bmma(config, rng, shape)
            both, _ = bench_bmma(config, rng, shape, with_quantize=True)
            row(results, copy, label, shape, config, alone, both, nbytes)
        for config in (TRIES[key] if "--tries" in sys.argv else ()):
            try:
                alone, nbytes = bench_bmma(config, rng, shape)
            except ValueError as e:    # a launch shape over the shared-memory limit
                print(f"| BMMA | {shape[0]}x{shape[1]} | {tuple(config)} | {e} |")
                continue
            row(results, copy, "BMMA try", shape, config, alone, alone, nbytes)
        save(results)
    print("\nbatched and swiglu (us, GEMV alone):")
    for shape, batch, glu in ((LONG, 2, False), (LONG, 8, False), (MID, 2, False),
                              (MID, 8, False), ((14336, 4096), 1, True)):
        key = 4096 if shape[1] <= 8192 else 14336
        configs = [DIRECT[key], q1_0_config(shape[1], batch)] + list(
            (TRIES[key][:6] if "--tries" in sys.argv else ()))
        for config in dict.fromkeys(configs):
            sec, nbytes = bench_bmma(config, rng, shape, batch=batch, glu=glu)
            results["rows"].append(dict(kernel="BMMA", m=shape[0], k=shape[1], batch=batch,
                                        glu=glu, config=tuple(config), us=sec * 1e6))
            print(f"  {shape[0]}x{shape[1]} batch {batch}{' swiglu' if glu else ''} "
                  f"{tuple(config)}: {sec * 1e6:.2f} us, {100 * nbytes / sec / 1e9 / copy:.0f}% "
                  f"copy", flush=True)
    save(results)


def bulk_main(rounds=2):
    """The default against the bulk-copy rings, alternated `rounds` times per shape."""
    pk.set_device("cuda")
    rng = np.random.default_rng(0)
    copy = copy_bandwidth() / 1e9
    results = {"copy_GBps": copy, "rows": []}
    print(f"copy bandwidth: {copy:.0f} GB/s; device {pk.current_device().name}")
    print("\n| kernel | m x k | config | us | GB/s | % copy | round |\n"
          "|---|---|---|---|---|---|---|")
    for shape in (BIG, MID, LONG):           # the shape over L2 first
        key = 4096 if shape[1] <= 8192 else 14336
        for r in range(rounds):
            default = q1_0_config(shape[1], rows=shape[0])
            for config in dict.fromkeys((default,) + BULK[key]):
                sec, nbytes = bench_bmma(config, rng, shape)
                gbps = nbytes / sec / 1e9
                label = ("default " if config == default else "") + (
                    "bulk" if config.bulk else "cp.async")
                results["rows"].append(dict(kernel=label, m=shape[0], k=shape[1], round=r,
                                            config=tuple(config), us=sec * 1e6, GBps=gbps))
                print(f"| {label} | {shape[0]}x{shape[1]} | {tuple(config)} | {sec * 1e6:.2f} | "
                      f"{gbps:.0f} | {100 * gbps / copy:.0f} | {r} |", flush=True)
            save(results)


def save(results):
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "q1_0_bmma.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    bulk_main() if "--bulk" in sys.argv else main()
