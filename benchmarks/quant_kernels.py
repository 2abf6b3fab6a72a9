"""Quantize / dequantize kernel throughput on the GPU (stdlib_kernels.quant.device).

Input: none (needs a CUDA GPU). Output: a markdown table on stdout and JSON at
$OUT/quant_kernels.json when $OUT is set.

Quantize: f16 matrices of 4096 x 14336 (117 MB, larger than the 50 MB L2) of random normal
values, timed with CUDA events over several launches; the 8B-model figure extrapolates the
elements/s to the 8.03e9 weights of Llama-3-8B (llama.cpp's CPU quantizer: 40 s, 16 threads).
Dequantize: the same matrices' blocks -> f16 rows; bandwidth = (block bytes + output bytes) / time.

    python3 benchmarks/quant_kernels.py [--quick]
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from stdlib_kernels.quant import reference  # noqa: E402
from stdlib_kernels.quant.device import dequantize, quantize  # noqa: E402

ROWS, COLS = 4096, 14336
MODEL_ELEMS = 8.03e9
FORMATS = ["Q6_K", "Q4_K", "Q5_K", "Q3_K", "Q2_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
           "Q1_0"]


def timed_ms(fn, reps: int) -> float:
    fn()                                   # compile + warm up
    pk.synchronize()
    start, stop = pk.Event(), pk.Event()
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_ms(stop) / reps


def bench_format(name: str, x, reps: int) -> dict:
    t0 = time.perf_counter()
    raw = quantize(x, name)
    pk.synchronize()
    first_s = time.perf_counter() - t0     # includes compiling the kernel
    q_ms = timed_ms(lambda: quantize(x, name), reps)
    d_ms = timed_ms(lambda: dequantize(raw, name, COLS, np.float16), reps)
    elems = ROWS * COLS
    moved = raw.nbytes + elems * 2
    sample = raw.numpy()[:2]
    exact = np.array_equal(sample, reference.quantize(x.numpy()[:2].astype(np.float32), name))
    return {"format": name, "quantize_ms": q_ms, "quantize_gelem_s": elems / q_ms / 1e6,
            "model_8b_s": MODEL_ELEMS / (elems / q_ms * 1e3), "dequant_ms": d_ms,
            "dequant_gb_s": moved / d_ms / 1e6, "first_call_s": first_s,
            "rows_match_reference": bool(exact)}


def main() -> None:
    quick = "--quick" in sys.argv
    pk.set_device("cuda")
    rng = np.random.default_rng(0)
    x = pk.to_device(rng.standard_normal((ROWS, COLS), dtype=np.float32).astype(np.float16))
    results = [bench_format(name, x, 3 if quick else 10)
               for name in (FORMATS[:3] if quick else FORMATS)]
    print(f"device: {pk.current_device()!r}; f16 input {ROWS} x {COLS}")
    print("| format | quantize ms | G elem/s | 8.03e9 elems (s) | dequant->f16 ms | GB/s |"
          " first call s | 2 rows == reference |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['format']} | {r['quantize_ms']:.2f} | {r['quantize_gelem_s']:.2f} | "
              f"{r['model_8b_s']:.2f} | {r['dequant_ms']:.3f} | {r['dequant_gb_s']:.0f} | "
              f"{r['first_call_s']:.1f} | {r['rows_match_reference']} |")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "quant_kernels.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
