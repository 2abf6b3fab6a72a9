"""Throughput of the numpy reference quantizers (stdlib_kernels.quant.reference).

Usage: python3 benchmarks/quant_reference_speed.py [--elements 4194304] [--repeat 3] [TYPE ...]
Prints, per type, the best-of-repeat quantize and dequantize speed in elements/s on Gaussian
rows of 4096, and the time that speed implies for a 135M-parameter model.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stdlib_kernels.quant import reference as ref  # noqa: E402

TYPES = ["F16", "BF16", "Q8_0", "Q8_1", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q1_0",
         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
MODEL_PARAMS = 135e6


def best_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="*", default=TYPES)
    parser.add_argument("--elements", type=int, default=4 * 1024 * 1024)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    width = 4096
    x = np.random.default_rng(0).standard_normal((args.elements // width, width))
    x = x.astype(np.float32)
    print(f"{x.size} elements ({x.shape[0]} rows x {width}), best of {args.repeat}")
    print(f"{'type':6} {'quantize Melem/s':>17} {'dequantize Melem/s':>19} {'135M params':>12}")
    for name in args.types:
        raw = ref.quantize(x, name)
        q_time = best_time(lambda: ref.quantize(x, name), args.repeat)
        d_time = best_time(lambda: ref.dequantize(raw, name, width), args.repeat)
        q_rate, d_rate = x.size / q_time, x.size / d_time
        print(f"{name:6} {q_rate / 1e6:17.1f} {d_rate / 1e6:19.1f} "
              f"{MODEL_PARAMS / q_rate:11.1f}s")


if __name__ == "__main__":
    main()
