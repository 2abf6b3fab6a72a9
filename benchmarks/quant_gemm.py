"""Prefill GEMM for the quants on the GPU: m=4096 rows, n=512 tokens, k=14336 (issue 5).

Input: none (needs a CUDA GPU). Output: a markdown table on stdout, raw numbers as JSON at
$OUT/quant_gemm.json when $OUT is set.

    python3 benchmarks/quant_gemm.py [--types Q4_K,Q6_K,Q4_0,Q8_0,Q5_K,Q4_1,Q5_0,Q5_1] [--quick]
        [--all-shapes] [--shipped]

--all-shapes adds m=14336 n=512 k=4096 and m=4096 n=512 k=4096 (llama-8B's other prefill GEMMs).
--shipped times only what the runner launches (tuned tiles, auto split-K): for A/B runs.

Rows: the f16 tensor-core GEMM (gemm.py), the per-32-block int8 GEMM (gemm_q8.py, its tuned
tiles: the "before"), and the super-block int8 GEMM (gemm_q8_k.py) over a sweep of tile shapes
Q8KTiles(mi, ni, wm, wn, stages) (Q4_0 / Q8_0: 8 blocks of 32 per step). Each launch is
replayed from a CUDA graph and timed with CUDA events (weights 33 MB for Q4_K: they fit the
50 MB L2 across replays, as in llama.cpp's test-backend-ops figure this is compared with).
Every int8 result is compared with the per-block kernel's on the same Q8_1 input (max
difference relative to max |y|) so that a fast but wrong configuration shows up. Weights are
random bytes with finite f16 scales.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks._timing import replay_seconds  # noqa: E402
from stdlib_kernels.quant.formats import get_format  # noqa: E402
from stdlib_kernels.quant.gemm import gemm_into  # noqa: E402
from stdlib_kernels.quant.gemm_q8 import TUNED_TILES, gemm_q8_into  # noqa: E402
from stdlib_kernels.quant.gemm_q8_k import Q8KTiles  # noqa: E402
from stdlib_kernels.quant.gemv import weight_words  # noqa: E402
from stdlib_kernels.quant.q8_1 import q8_1_bytes, quantize_q8_1_into  # noqa: E402

SHAPES = ((4096, 512, 14336), (14336, 512, 4096), (4096, 512, 4096))   # (m, n, k)
T = Q8KTiles
SWEEP = {"Q4_K": (T(4, 2, 2, 8, 3), T(4, 4, 2, 4, 3), T(2, 4, 4, 4, 3), T(2, 8, 4, 2, 3),
                  T(4, 2, 4, 4, 3), T(2, 2, 2, 8, 3), T(4, 2, 2, 4, 3), T(2, 4, 2, 4, 3),
                  T(4, 2, 2, 4, 4), T(2, 4, 2, 2, 3)),
         "Q6_K": (T(2, 8, 4, 2, 3), T(1, 8, 8, 2, 3), T(4, 2, 2, 8, 3), T(2, 4, 4, 4, 3),
                  T(2, 2, 2, 8, 3), T(4, 4, 2, 4, 3), T(2, 4, 4, 2, 3), T(2, 4, 2, 4, 3),
                  T(2, 4, 2, 2, 3)),
         "Q4_0": (T(4, 4, 2, 4, 3), T(4, 2, 2, 8, 3), T(2, 4, 4, 4, 3), T(2, 8, 4, 2, 3),
                  T(4, 2, 2, 4, 3), T(2, 2, 2, 8, 3)),
         "Q8_0": (T(2, 4, 2, 4, 3), T(2, 2, 2, 8, 3), T(4, 4, 2, 2, 3), T(2, 4, 4, 2, 3),
                  T(1, 8, 4, 2, 3), T(1, 4, 4, 4, 3), T(4, 3, 2, 4, 3), T(2, 3, 4, 4, 3),
                  T(3, 4, 2, 4, 3), T(2, 5, 4, 2, 3))}   # last 4: 128x96 (2), 96x128, 128x80
SWEEP["Q6_K"] += (T(3, 4, 2, 4, 3), T(2, 6, 4, 2, 3), T(4, 4, 2, 4, 3))
# the 32-value formats allocate no scale buffers (32 KB at 128 x 128): a fourth stage, and
# Q8_0's 128 x 128 tiles, fit
SWEEP["Q4_0"] += (T(2, 8, 4, 2, 4), T(4, 4, 2, 4, 4))
SWEEP["Q8_0"] += (T(2, 4, 4, 2, 4), T(2, 8, 4, 2, 3), T(4, 4, 2, 4, 3))
# Q5_K: Q4_K's candidates; Q4_1 / Q5_0 / Q5_1: Q4_0's and 96 x 128
SWEEP["Q5_K"] = SWEEP["Q4_K"] + (T(3, 4, 2, 4, 3),)
for _t in ("Q4_1", "Q5_0", "Q5_1"):
    SWEEP[_t] = SWEEP["Q4_0"] + (T(3, 4, 2, 4, 3), T(4, 2, 2, 4, 3))
# f16 d (and dmin / m) inside each block
SCALE_BYTES = {"Q4_K": (0, 4), "Q6_K": (208, 2), "Q4_0": (0, 2), "Q8_0": (0, 2), "Q5_K": (0, 4),
               "Q4_1": (0, 4), "Q5_0": (0, 2), "Q5_1": (0, 4)}


def random_raw(type_name: str, rows: int, k: int, rng):
    """Random quants (rows, row bytes) uint8 on the device, with f16 scales drawn from
    N(0, 0.01) (random bytes there could be NaN/inf)."""
    fmt = get_format(type_name)
    raw = np.frombuffer(rng.bytes(rows * k // fmt.block_elems * fmt.block_bytes),
                        np.uint8).reshape(rows, -1, fmt.block_bytes).copy()
    at, size = SCALE_BYTES[type_name]
    halves = (rng.standard_normal(raw.shape[:2] + (size // 2,)) * 0.01).astype(np.float16)
    raw[:, :, at:at + size] = halves.view(np.uint8).reshape(raw.shape[:2] + (size,))
    return pk.to_device(raw.reshape(rows, -1))


def random_weights(type_name: str, rows: int, k: int, rng):
    """random_raw as the GEMMs' weight words (gemv.weight_words)."""
    return weight_words(random_raw(type_name, rows, k, rng), type_name, k)[0]


def time_graph(launch_all, replays: int = 5) -> float:
    return replay_seconds(lambda: launch_all(None), replays)


def timed(launch, reps: int = 3) -> float:
    def run(stream):
        for _ in range(reps):
            launch(stream)
    return time_graph(run) / reps


def warm(jobs):
    """Worker: compile (and load) each (type, tiles) once on a tiny problem."""
    pk.set_device("cuda")
    rng = np.random.default_rng(1)
    for type_name, tiles in jobs:
        w = random_weights(type_name, 4, 256, rng)
        xq = pk.zeros((4, q8_1_bytes(256)), np.uint8)
        try:
            gemm_q8_into(w, type_name, xq, pk.empty((4, 4), np.float32), 4, 256, 4, tiles=tiles)
        except pk.LaunchError as e:   # e.g. over the shared-memory limit: reported in the sweep
            print(f"warm-up {type_name} {tuple(tiles)}: {e}", flush=True)
    pk.synchronize()
    return len(jobs)


def precompile(types, sweep):
    import multiprocessing as mp
    jobs = [(t, tiles) for t in types for tiles in (TUNED_TILES[t],) + sweep[t]]
    chunks = [jobs[i::12] for i in range(12)]
    with mp.get_context("spawn").Pool(12) as pool:
        pool.map(warm, [c for c in chunks if c])


def bench_type(type_name: str, shape, sweep, rng, results):
    M, TOKENS, K = shape
    w = random_weights(type_name, M, K, rng)
    x = pk.to_device(rng.standard_normal((TOKENS, K)).astype(np.float32))
    xq = pk.empty((TOKENS, q8_1_bytes(K)), np.uint8)
    quantize_q8_1_into(x, xq)
    y = pk.empty((TOKENS, M), np.float32)
    sec = timed(lambda s: gemm_into(w, type_name, x, y, M, K, TOKENS, stream=s, warps=(2, 4)))
    row(results, shape, type_name, "f16 GEMM", (2, 4), sec, None)
    before = TUNED_TILES[type_name]
    sec = timed(lambda s: gemm_q8_into(w, type_name, xq, y, M, K, TOKENS, stream=s,
                                       tiles=before))
    ref = y.numpy().astype(np.float64)
    row(results, shape, type_name, "int8 per-block (before)", tuple(before), sec, 0.0)
    for tiles in sweep[type_name]:
        try:
            y.fill(np.nan)
            sec = timed(lambda s: gemm_q8_into(w, type_name, xq, y, M, K, TOKENS, stream=s,
                                               tiles=tiles))
        except Exception as e:   # e.g. over the shared-memory limit
            print(f"| {shape} | {type_name} | int8 super-block | {tuple(tiles)} | failed: {e} |")
            continue
        diff = float(np.nanmax(np.abs(y.numpy() - ref)) / np.abs(ref).max())
        if np.isnan(y.numpy()).any():
            diff = float("nan")
        row(results, shape, type_name, "int8 super-block", tuple(tiles), sec, diff)
    best = min((r for r in results if r["type"] == type_name and r["shape"] == list(shape)
                and r["path"] == "int8 super-block"
                and r["rel_diff"] is not None and r["rel_diff"] < 1e-4),
               key=lambda r: r["us"], default=None)
    if best:
        tiles = Q8KTiles(*best["tiles"])
        sec = timed(lambda s: (quantize_q8_1_into(x, xq, stream=s),
                               gemm_q8_into(w, type_name, xq, y, M, K, TOKENS, stream=s,
                                            tiles=tiles)))
        print(f"| {shape} | {type_name} | best + Q8_1 quantize | {tuple(tiles)} | "
              f"{sec * 1e6:.0f} | {2.0 * M * TOKENS * K / sec / 1e12:.1f} | |", flush=True)
        best["with_quantize_us"] = sec * 1e6


def shipped_table(types, shapes):
    """us of gemm_q8k_into as the runner calls it (tuned tiles, auto split-K), per type and
    shape, and the layer-weighted total of the 8B's GEMMs (RESULTS.md's tile sweeps)."""
    from stdlib_kernels.quant.gemm_q8_k import gemm_q8k_into
    pk.set_device("cuda")
    rng = np.random.default_rng(0)
    weights = {(4096, 512, 14336): 1.0, (14336, 512, 4096): 2.0, (4096, 512, 4096): 2.5}
    print(f"{pk.current_device().name}: the shipped int8 GEMM, us per launch")
    print("| type | " + " | ".join(str(s) for s in shapes) + " | weighted |")
    print("|---" * (len(shapes) + 2) + "|")
    for type_name in types:
        cells, total = [], 0.0
        for M, TOKENS, K in shapes:
            w = random_weights(type_name, M, K, rng)
            x = pk.to_device(rng.standard_normal((TOKENS, K)).astype(np.float32))
            xq = pk.empty((TOKENS, q8_1_bytes(K)), np.uint8)
            quantize_q8_1_into(x, xq)
            y = pk.empty((TOKENS, M), np.float32)
            us = timed(lambda s: gemm_q8k_into(w, type_name, xq, y, M, K, TOKENS,
                                               stream=s)) * 1e6
            cells.append(f"{us:.0f}")
            total += weights.get((M, TOKENS, K), 1.0) * us
        print(f"| {type_name} | " + " | ".join(cells) + f" | {total:.0f} |", flush=True)


def row(results, shape, type_name, path, tiles, sec, diff):
    flop = 2.0 * shape[0] * shape[1] * shape[2]
    results.append(dict(shape=list(shape), type=type_name, path=path, tiles=list(tiles),
                        us=sec * 1e6, TFLOPS=flop / sec / 1e12, rel_diff=diff))
    d = "" if diff is None else f"{diff:.1e}"
    print(f"| {shape} | {type_name} | {path} | {tuple(tiles)} | {sec * 1e6:.0f} | "
          f"{flop / sec / 1e12:.1f} | {d} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q4_K,Q6_K")
    ap.add_argument("--quick", action="store_true", help="only the first two tile shapes")
    ap.add_argument("--all-shapes", action="store_true", help="also the k=4096 GEMMs")
    ap.add_argument("--shipped", action="store_true",
                    help="only the library's own choice (tiles, split-K) per type and shape")
    args = ap.parse_args()
    types = args.types.split(",")
    if args.shipped:
        shipped_table(types, SHAPES if args.all_shapes else SHAPES[:1])
        return
    sweep = {t: v[:2] for t, v in SWEEP.items()} if args.quick else SWEEP
    precompile(types, sweep)
    pk.set_device("cuda")
    rng = np.random.default_rng(0)
    print("llama.cpp q4_K at (m, n, k) = (4096, 512, 14336): 348 us (173 TFLOPS)")
    print("| (m, n, k) | type | path | tiles | us | TFLOPS | max diff / max y |\n"
          "|---|---|---|---|---|---|---|")
    results = []
    for shape in SHAPES if args.all_shapes else SHAPES[:1]:
        for type_name in types:
            bench_type(type_name, shape, sweep, rng, results)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "quant_gemm.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
