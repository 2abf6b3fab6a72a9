"""Quantized matmul on the GPU: decode GEMV (m=4096, k=14336) and prefill GEMM (n=512 tokens).

Input: none (needs a CUDA GPU). Output: a markdown table per part on stdout, and the raw numbers
as JSON at $OUT/quant_matmul.json when $OUT is set.

Timing: launches are captured into a CUDA graph (so host launch cost is not measured) and the
replays are timed with CUDA events. Weight buffers are rotated so the bytes read per pass exceed
the 50 MB L2 several times: every GEMV streams its weights from HBM. Weights are random bytes in
the right layout (speed does not depend on the values). Copy bandwidth = 2 x bytes / time of a
16-byte-vector copy kernel over 1 GiB.

    python3 benchmarks/quant_matmul.py [--budget SECONDS]   (sweeps stop early to fit)
    python3 benchmarks/quant_matmul.py --gemm-only          (prefill GEMM: int8 vs f16 only)
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from pykernel import Ptr, f32, i32  # noqa: E402
from stdlib_kernels.quant.formats import get_format  # noqa: E402
from stdlib_kernels.quant.gemm import gemm_into  # noqa: E402
from stdlib_kernels.quant.gemm_q8 import Q8GemmTiles, gemm_q8_into  # noqa: E402
from stdlib_kernels.quant.gemv import (GemvConfig, gemv_f32_into,  # noqa: E402
                                       gemv_q8_into, weight_words)
from stdlib_kernels.quant.q8_1 import q8_1_bytes, quantize_q8_1_into  # noqa: E402
from stdlib_kernels.quant.rmsnorm_q8_1 import rmsnorm_q8_1_into  # noqa: E402
from stdlib_kernels.norm import rmsnorm  # noqa: E402

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


def bench_gemv(type_name: str, path: str, config, rng, batch: int = 1, with_quantize=False):
    """Seconds per GEMV (plus the Q8_1 quantization of x when with_quantize, as llama.cpp's
    figures include it) and the weight bytes it streams."""
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
                if with_quantize:
                    quantize_q8_1_into(x, xq, stream=stream)
                gemv_q8_into(w, type_name, xq, y, M, K, batch, stream=stream, config=config)
            else:
                gemv_f32_into(w, type_name, x, y, M, K, batch, stream=stream, config=config)
    seconds = time_graph(run) / reps
    return seconds, nbytes


def bench_quantize(rng) -> float:
    x = pk.to_device(rng.standard_normal((1, K)).astype(np.float32))
    xq = pk.empty((1, q8_1_bytes(K)), np.uint8)

    def run(stream):
        for _ in range(50):
            quantize_q8_1_into(x, xq, stream=stream)
    return time_graph(run) / 50


def bench_gemm(type_name: str, rng, warps=None):
    weights, _ = random_weights(type_name, M, K, 1, rng)
    x = pk.to_device(rng.standard_normal((TOKENS, K)).astype(np.float32))
    y = pk.empty((TOKENS, M), np.float32)

    def run(stream):
        for _ in range(3):
            gemm_into(weights[0], type_name, x, y, M, K, TOKENS, stream=stream, warps=warps)
    seconds = time_graph(run, replays=3) / 3
    return seconds, 2.0 * M * K * TOKENS / seconds / 1e12


def bench_gemm_q8(type_name: str, rng, tiles, with_quantize=False):
    """Seconds per int8 GEMM (plus the Q8_1 quantization of the 512 x K activations when
    with_quantize: the whole prefill matmul) and its TFLOPS."""
    weights, _ = random_weights(type_name, M, K, 1, rng)
    x = pk.to_device(rng.standard_normal((TOKENS, K)).astype(np.float32))
    xq = pk.empty((TOKENS, q8_1_bytes(K)), np.uint8)
    quantize_q8_1_into(x, xq)
    y = pk.empty((TOKENS, M), np.float32)

    def run(stream):
        for _ in range(3):
            if with_quantize:
                quantize_q8_1_into(x, xq, stream=stream)
            gemm_q8_into(weights[0], type_name, xq, y, M, K, TOKENS, stream=stream, tiles=tiles)
    seconds = time_graph(run, replays=3) / 3
    return seconds, 2.0 * M * K * TOKENS / seconds / 1e12


Q8_TILES = (Q8GemmTiles(2, 4, 4, 2, 4), Q8GemmTiles(4, 4, 2, 4, 4), Q8GemmTiles(2, 4, 2, 4, 4))


def compare_gemm(rng, results):
    """int8 (several tiles) against f16 tensor-core GEMM per type, m=4096 n=512 k=14336."""
    print("\n| type | path | tiles | us | TFLOPS | + Q8_1 quantize us |  (llama.cpp q4_K: 348 us)")
    print("|---|---|---|---|---|---|")
    for type_name in ("Q4_K", "Q4_0", "Q8_0", "Q6_K"):
        sec, tflops = bench_gemm(type_name, rng, (2, 4))
        results["gemm"].append(dict(type=type_name, path="f16", us=sec * 1e6, TFLOPS=tflops))
        print(f"| {type_name} | f16 | (2, 4) | {sec * 1e6:.0f} | {tflops:.1f} | |", flush=True)
        for tiles in Q8_TILES:
            try:
                sec, tflops = bench_gemm_q8(type_name, rng, tiles)
                both, _ = bench_gemm_q8(type_name, rng, tiles, with_quantize=True)
            except Exception as e:   # e.g. a tile shape over the shared-memory limit
                print(f"| {type_name} | int8 | {tuple(tiles)} | failed: {e} |", flush=True)
                continue
            results["gemm"].append(dict(type=type_name, path="int8", tiles=tiles,
                                        us=sec * 1e6, TFLOPS=tflops, with_quantize_us=both * 1e6))
            print(f"| {type_name} | int8 | {tuple(tiles)} | {sec * 1e6:.0f} | {tflops:.1f} | "
                  f"{both * 1e6:.0f} |", flush=True)
        save(results)


def bench_rmsnorm_q8_1(rng, n: int = 4096):
    """Fused RMSNorm + Q8_1 quantize vs the two launches it replaces, one decode row."""
    x = pk.to_device(rng.standard_normal((1, n)).astype(np.float32))
    wt = pk.to_device(rng.standard_normal(n).astype(np.float32))
    normed = pk.empty((1, n), np.float32)
    xq = pk.empty((1, q8_1_bytes(n)), np.uint8)

    def fused(stream):
        for _ in range(50):
            rmsnorm_q8_1_into(x, wt, 1e-5, xq, stream=stream)

    def separate(stream):
        for _ in range(50):
            rmsnorm(x, wt, 1e-5, out=normed, stream=stream)
            quantize_q8_1_into(normed, xq, stream=stream)
    return time_graph(fused) / 50, time_graph(separate) / 50


def configs(warps=(4,), splits=(1, 2, 4), rows=(1, 2), unrolls=(1, 2), widens=(1, 2, 4)):
    return [GemvConfig(w, k, r, u, v) for w in warps for k in splits if k <= w for r in rows
            for u in unrolls for v in widens]


SWEEP = configs() + configs(warps=(8,), splits=(2, 8), unrolls=(1,))
SHORT_SWEEP = configs(unrolls=(1,), splits=(1, 2))
BATCH_SWEEP = configs(splits=(1, 2), rows=(1, 2, 4), unrolls=(1,), widens=(1, 2))
TARGET_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K", "Q1_0")
NEW_TYPES = ("Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K")


def sweep_gemv(rng, copy, deadline, results):
    print("\n| type | path | config (warps, split, rows, unroll) | us | GB/s | % copy | "
          "llama.cpp H200 us |")
    print("|---|---|---|---|---|---|---|")
    best = {}
    cases = [(t, "q8_1", SWEEP) for t in TARGET_TYPES] + \
        [(t, "q8_1", SHORT_SWEEP) for t in NEW_TYPES] + [("F16", "f32", [None])]
    for type_name, path, configs in cases:
        for config in configs:
            if time.time() > deadline:
                return best
            sec, nbytes = bench_gemv(type_name, path, config, rng)
            gbps = nbytes / sec / 1e9
            results["gemv"].append(dict(type=type_name, path=path, config=config, us=sec * 1e6,
                                        GBps=gbps))
            if type_name not in best or sec < best[type_name][0]:
                best[type_name] = (sec, config)
            print(f"| {type_name} | {path} | {tuple(config or ())} | {sec * 1e6:.1f} | "
                  f"{gbps:.0f} | {100 * gbps / copy:.0f} | "
                  f"{LLAMA_CPP_H200_US.get(type_name, '')} |", flush=True)
    return best


def main():
    budget = float(sys.argv[sys.argv.index("--budget") + 1]) if "--budget" in sys.argv else 1e9
    deadline = time.time() + budget
    pk.set_device("cuda")
    rng = np.random.default_rng(0)
    if "--gemm-only" in sys.argv:
        results = {"gemm": []}
        compare_gemm(rng, results)
        return
    results = {"copy_GBps": copy_bandwidth() / 1e9, "gemv": [], "gemm": []}
    copy = results["copy_GBps"]
    print(f"copy bandwidth: {copy:.0f} GB/s (2 x bytes / time, 1 GiB)")
    results["q8_1_quantize_us"] = bench_quantize(rng) * 1e6
    print(f"quantize_q8_1 of {K} values: {results['q8_1_quantize_us']:.2f} us")
    fused, separate = bench_rmsnorm_q8_1(rng)
    results["rmsnorm_q8_1_us"] = {"fused": fused * 1e6, "separate": separate * 1e6}
    print(f"rmsnorm + quantize_q8_1 (n=4096): fused {fused * 1e6:.2f} us, "
          f"two launches {separate * 1e6:.2f} us")
    best = sweep_gemv(rng, copy, deadline - 100, results)
    results["best"] = {t: (sec * 1e6, config) for t, (sec, config) in best.items()}
    print("\nbest per type:", {t: (round(us, 1), tuple(c or ()))
                               for t, (us, c) in results["best"].items()})
    save(results)
    print("\nbest config + the Q8_1 quantization in the same graph (llama.cpp's figures include "
          "it):")
    for type_name, (sec, config) in best.items():
        if type_name in TARGET_TYPES and time.time() < deadline - 70:
            both, _ = bench_gemv(type_name, "q8_1", config, rng, with_quantize=True)
            results[f"gemv_{type_name}_with_quantize_us"] = both * 1e6
            print(f"  {type_name} {tuple(config)}: {sec * 1e6:.1f} us, with quantize "
                  f"{both * 1e6:.1f} us", flush=True)
    print("\nbatched Q4_K GEMV (config: warps, split, rows, unroll, widen):")
    for batch in (2, 4, 8):
        for config in BATCH_SWEEP:
            if time.time() < deadline - 40:
                sec, nbytes = bench_gemv("Q4_K", "q8_1", config, rng, batch=batch)
                results["gemv"].append(dict(type="Q4_K", batch=batch, config=config,
                                            us=sec * 1e6))
                print(f"  batch {batch} {tuple(config)}: {sec * 1e6:.1f} us "
                      f"({nbytes / sec / 1e9:.0f} GB/s)", flush=True)
    save(results)
    print("\n| GEMM type | warps | m x n x k | us | TFLOPS |  (llama.cpp q4_K: 348 us, 173 TFLOPS)")
    print("|---|---|---|---|---|")
    for type_name, warps in (("Q4_K", (2, 4)), ("Q4_K", (4, 2)), ("Q4_K", (2, 2)),
                             ("Q6_K", (2, 4)), ("Q8_0", (2, 4))):
        if time.time() < deadline:
            sec, tflops = bench_gemm(type_name, rng, warps)
            results["gemm"].append(dict(type=type_name, warps=warps, us=sec * 1e6,
                                        TFLOPS=tflops))
            print(f"| {type_name} | {warps} | {M} x {TOKENS} x {K} | {sec * 1e6:.0f} | "
                  f"{tflops:.1f} |", flush=True)
    save(results)


def save(results):
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "quant_matmul.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
