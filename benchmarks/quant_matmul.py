"""Quantized matmul on the GPU: decode GEMV (m=4096, k=14336) and prefill GEMM (n=512 tokens).

Input: none (needs a CUDA GPU). Output: a markdown table per part on stdout, and the raw numbers
as JSON at $OUT/quant_matmul.json when $OUT is set.

Timing: launches are captured into a CUDA graph (so host launch cost is not measured) and the
replays are timed with CUDA events. Weight buffers are rotated so the bytes read per pass exceed
the 50 MB L2 several times: every GEMV streams its weights from HBM. Weights are random bytes in
the right layout (speed does not depend on the values). Copy bandwidth = 2 x bytes / time of a
16-byte-vector copy kernel over 1 GiB.

    python3 benchmarks/quant_matmul.py [--quick]
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from pykernel import Ptr, f32, i32  # noqa: E402
from stdlib_kernels.quant.formats import get_format  # noqa: E402
from stdlib_kernels.quant.gemm import gemm_into  # noqa: E402
from stdlib_kernels.quant.gemv import (gemv_f32_into, gemv_q8_into,  # noqa: E402
                                       weight_words)
from stdlib_kernels.quant.q8_1 import q8_1_bytes, quantize_q8_1_into  # noqa: E402

M, K, TOKENS = 4096, 14336, 512
LLAMA_CPP_H200_US = {"Q4_0": 14.5, "Q4_1": 11.7, "Q8_0": 22.9, "Q4_K": 15.7, "Q6_K": 24.1,
                     "Q1_0": 10.5}
L2_BYTES = 50 << 20


@pk.kernel
def copy_kernel(src: Ptr[f32, "ro"], dst: Ptr[f32], n4: i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    stride = pk.grid_dim.x * pk.block_dim.x
    while i < n4:
        a, b, c, d = pk.load_vec(src, 4 * i, 4)
        pk.store_vec(dst, 4 * i, (a, b, c, d))
        i += stride


def time_graph(launch_all, replays: int = 5) -> float:
    """Seconds per replay of a graph holding the launches made by launch_all()."""
    stream = pk.Stream()
    launch_all(stream)   # compile + warm up outside the capture
    with pk.capture_graph(stream) as graph:
        launch_all(None)
    graph.replay(stream)
    start, end = pk.Event(), pk.Event()
    start.record(stream)
    for _ in range(replays):
        graph.replay(stream)
    end.record(stream)
    return start.elapsed_ms(end) / 1e3 / replays


def copy_bandwidth() -> float:
    n = 1 << 28  # 1 GiB of f32
    src, dst = pk.zeros(n, np.float32), pk.zeros(n, np.float32)

    def run(stream):
        for _ in range(5):
            copy_kernel[132 * 16, 256, stream](src, dst, n // 4)
    return 2 * src.nbytes * 5 / time_graph(run)


_WEIGHTS = {}


def random_weights(type_name: str, rows: int, k: int, count: int, rng):
    """count device weight buffers (cached per type); random bytes, finite values for F16."""
    fmt = get_format(type_name)
    per_row = k // fmt.block_elems * fmt.block_bytes
    out = _WEIGHTS.setdefault(type_name, [])
    while len(out) < count:
        raw = np.frombuffer(rng.bytes(rows * per_row), np.uint8).reshape(rows, per_row)
        if type_name in ("F16", "BF16"):   # finite values: no NaN/inf slow paths
            raw = (raw & 0x3B).astype(np.uint8)
        out.append(weight_words(pk.to_device(raw), type_name, k)[0])
    return out[:count], rows * per_row


def bench_gemv(type_name: str, path: str, warps: int, rng, batch: int = 1):
    fmt = get_format(type_name)
    nbytes = M * (K // fmt.block_elems * fmt.block_bytes)
    weights, _ = random_weights(type_name, M, K, max(2, -(-4 * L2_BYTES // nbytes)), rng)
    x = pk.to_device(rng.standard_normal((batch, K)).astype(np.float32))
    xq = pk.empty((batch, q8_1_bytes(K)), np.uint8)
    quantize_q8_1_into(x, xq)
    y = pk.empty((batch, M), np.float32)
    reps = 8 * len(weights)

    def run(stream):
        for r in range(reps):
            w = weights[r % len(weights)]
            if path == "q8_1":
                gemv_q8_into(w, type_name, xq, y, M, K, batch, stream=stream, warps=warps)
            else:
                gemv_f32_into(w, type_name, x, y, M, K, batch, stream=stream, warps=warps)
    seconds = time_graph(run) / reps
    return seconds, nbytes


def bench_quantize(rng) -> float:
    x = pk.to_device(rng.standard_normal((1, K)).astype(np.float32))
    xq = pk.empty((1, q8_1_bytes(K)), np.uint8)

    def run(stream):
        for _ in range(50):
            quantize_q8_1_into(x, xq, stream=stream)
    return time_graph(run) / 50


def bench_gemm(type_name: str, rng):
    weights, _ = random_weights(type_name, M, K, 1, rng)
    x = pk.to_device(rng.standard_normal((TOKENS, K)).astype(np.float32))
    y = pk.empty((TOKENS, M), np.float32)

    def run(stream):
        for _ in range(3):
            gemm_into(weights[0], type_name, x, y, M, K, TOKENS, stream=stream)
    seconds = time_graph(run, replays=3) / 3
    return seconds, 2.0 * M * K * TOKENS / seconds / 1e12


def main():
    quick = "--quick" in sys.argv
    pk.set_device("cuda")
    rng = np.random.default_rng(0)
    results = {"copy_GBps": copy_bandwidth() / 1e9}
    copy = results["copy_GBps"]
    print(f"copy bandwidth: {copy:.0f} GB/s (2 x bytes / time, 1 GiB)")
    results["q8_1_quantize_us"] = bench_quantize(rng) * 1e6
    print(f"quantize_q8_1 of {K} values: {results['q8_1_quantize_us']:.2f} us")
    print("\n| type | path | warps/row | us | GB/s | % copy | llama.cpp H200 us |")
    print("|---|---|---|---|---|---|---|")
    gemv_rows = []
    cases = [(t, "q8_1") for t in ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K")] + \
        [(t, "f32") for t in (("Q1_0",) if quick else ("Q4_K", "Q1_0", "Q8_0", "F16"))]
    for type_name, path in cases:
        for warps in ((4, 8) if quick else (2, 4, 8)):
            sec, nbytes = bench_gemv(type_name, path, warps, rng)
            gbps = nbytes / sec / 1e9
            gemv_rows.append(dict(type=type_name, path=path, warps=warps, us=sec * 1e6,
                                  GBps=gbps))
            print(f"| {type_name} | {path} | {warps} | {sec * 1e6:.1f} | {gbps:.0f} | "
                  f"{100 * gbps / copy:.0f} | {LLAMA_CPP_H200_US.get(type_name, '')} |",
                  flush=True)
    results["gemv"] = gemv_rows
    print("\nbatched GEMV (q8_1, 4 warps):")
    for batch in (2, 4, 8):
        sec, nbytes = bench_gemv("Q4_K", "q8_1", 4, rng, batch=batch)
        results[f"gemv_Q4_K_batch{batch}_us"] = sec * 1e6
        print(f"  Q4_K batch {batch}: {sec * 1e6:.1f} us ({nbytes / sec / 1e9:.0f} GB/s)")
    print(f"\n| GEMM type | m x n x k | us | TFLOPS |  (llama.cpp q4_K: 348 us, 173 TFLOPS)")
    print("|---|---|---|---|")
    gemm_rows = []
    for type_name in ("Q4_K",) if quick else ("Q4_K", "Q6_K", "Q4_0", "Q8_0", "F16"):
        sec, tflops = bench_gemm(type_name, rng)
        gemm_rows.append(dict(type=type_name, us=sec * 1e6, TFLOPS=tflops))
        print(f"| {type_name} | {M} x {TOKENS} x {K} | {sec * 1e6:.0f} | {tflops:.1f} |",
              flush=True)
    results["gemm"] = gemm_rows
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "quant_matmul.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
