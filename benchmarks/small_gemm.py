"""The weight matmuls of a short prompt (2-128 tokens) on the GPU, one shape at a time: the
super-block int8 GEMM (gemm_q8_k) over tile shapes, the multi-token GEMV up to 8 tokens, and
the tensor-core GEMV (gemv_mma, Q4_K) up to 16 over its warps x unroll.

Input: none (needs a CUDA GPU). Output: a markdown table per (shape, tokens): us per launch,
weight bytes / time (TB/s: a short prompt's matmuls are bound by streaming the weights once),
the largest difference from the first row relative to max |y| (a wrong configuration shows).
Each tile shape runs unsplit and with its K split over blocks (gemm_q8_k.auto_split's choice,
and 2 / 4 / 8 for the first tiles).

    python3 benchmarks/small_gemm.py [--tokens 2,4,8,16,32,64,128] [--shapes 8b|1.5b|8b-q8_0]
        [--only N]   (the first N shapes)   [--tiles 2.4.4.2.3,...]   (more tile shapes)
        [--no-gemm]  (only the GEMVs)

Shapes: llama-8B's (Q4_K_M: q|k 5120 x 4096 and v 1024 x 4096, gate|up 28672 x 4096, o 4096 x
4096, down 4096 x 14336 as Q4_K and as Q6_K), qwen2-1.5B's, or the 8B's of a Q8_0 file. Each
launch reads its own copy of the weights out of >= 160 MB (more than three times the 50 MB L2
of an H200), as the 32 layers of a prefill do; the launches are replayed from a CUDA graph
and timed with events.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks._timing import replay_seconds  # noqa: E402
from benchmarks.quant_gemm import random_weights  # noqa: E402
from stdlib_kernels.quant import gemm_q8_k  # noqa: E402
from stdlib_kernels.quant.gemm_q8_k import Q8KTiles as T, gemm_q8k_into  # noqa: E402
from stdlib_kernels.quant.gemv import gemv_q8_into  # noqa: E402
from stdlib_kernels.quant.gemv_mma import MAX_TOKENS, MMA_GEMV_TYPES, gemv_mma_into  # noqa: E402
from stdlib_kernels.quant.q8_1 import q8_1_bytes, quantize_q8_1_into  # noqa: E402

SHAPES = {"8b": [("Q4_K", 5120, 4096), ("Q6_K", 1024, 4096), ("Q4_K", 28672, 4096),
                 ("Q4_K", 4096, 4096), ("Q4_K", 4096, 14336), ("Q6_K", 4096, 14336)],
          "1.5b": [("Q4_K", 1792, 1536), ("Q4_K", 17920, 1536), ("Q4_K", 1536, 1536),
                   ("Q6_K", 1536, 8960)],
          # a Q8_0 file's: q|k|v fused, gate|up fused, o, down
          "8b-q8_0": [("Q8_0", 6144, 4096), ("Q8_0", 28672, 4096), ("Q8_0", 4096, 4096),
                      ("Q8_0", 4096, 14336)]}
BYTES_PER_VALUE = {"Q4_K": 144 / 256, "Q6_K": 210 / 256, "Q8_0": 34 / 32}
# candidate tiles (mi, ni, wm, wn, stages): BM = 16 mi wm weight rows, BN = 8 ni wn tokens
CANDIDATES = [T(1, 2, 4, 1, 3), T(1, 2, 2, 1, 4), T(1, 1, 2, 1, 6), T(1, 4, 4, 1, 3),
              T(1, 4, 2, 1, 4), T(1, 4, 4, 2, 3), T(1, 4, 2, 2, 4), T(2, 4, 4, 2, 3),
              T(1, 6, 4, 2, 3), T(1, 8, 4, 2, 3), T(2, 8, 4, 2, 3), T(1, 8, 2, 4, 3),
              T(2, 3, 4, 2, 3), T(2, 5, 4, 2, 3), T(2, 6, 4, 2, 3)]


def candidates(tokens: int) -> list[T]:
    """Tiles whose token width is at least a quarter of the tokens and at most 2x them."""
    return [t for t in CANDIDATES if t.shape[1] <= max(8, 2 * tokens)
            and 4 * t.shape[1] >= tokens]


# gemv_mma (warps, unroll, m16 tiles per warp)
MMA_CONFIGS = [(w, u, t) for w in (4, 8) for u in (1, 2) for t in (1, 2, 4)]


def bench(type_name, rows, k, tokens, ws, rng, extra=(), gemm=True):
    nbytes = rows * k * BYTES_PER_VALUE[type_name]
    copies = len(ws)
    x = pk.to_device(rng.standard_normal((tokens, k)).astype(np.float32))
    xq = pk.empty((tokens, q8_1_bytes(k)), np.uint8)
    quantize_q8_1_into(x, xq)
    y = pk.empty((tokens, rows), np.float32)
    runs = []
    if tokens <= 8:
        runs.append(("GEMV", lambda w: gemv_q8_into(w, type_name, xq, y, rows, k, tokens)))
    if type_name in MMA_GEMV_TYPES and tokens <= MAX_TOKENS:
        for w_, u_, t_ in MMA_CONFIGS:
            runs.append((f"MMA GEMV {w_} warps, unroll {u_}, {t_} tiles",
                         lambda w, w_=w_, u_=u_, t_=t_: gemv_mma_into(
                             w, type_name, xq, y, rows, k, tokens, warps=w_, unroll=u_,
                             tiles=t_)))
    default = gemm_q8_k.tuned_tiles(type_name, tokens)
    tiles_list = [default] + [t for t in [*extra, *candidates(tokens)] if t != default]
    tiles_list = list(dict.fromkeys(tiles_list))[:None if gemm else 1]
    for tiles in tiles_list:
        auto = gemm_q8_k.launch_split(type_name, rows, k, tokens, tiles)
        for split in sorted({1, auto} | ({2, 4, 8} if tiles in tiles_list[:4] else set())):
            if split > k // 256:
                continue
            name = (f"GEMM {tuple(tiles)} split {split}"
                    f"{' (default tiles)' if tiles == default else ''}"
                    f"{' (auto)' if split == auto else ''}")
            runs.append((name, lambda w, tiles=tiles, split=split: gemm_q8k_into(
                w, type_name, xq, y, rows, k, tokens, tiles=tiles, split=split)))
    ref = None
    for name, launch in runs:
        try:
            y.fill(np.nan)
            launch(ws[0])
            out = y.numpy().astype(np.float64)
            sec = replay_seconds(lambda: [launch(w) for w in ws], 5) / copies
        except Exception as e:  # noqa: BLE001 - e.g. a tile over the shared-memory limit
            print(f"| {type_name} {rows} x {k} | {tokens} | {name} | failed: {e} | | |",
                  flush=True)
            continue
        ref = out if ref is None else ref
        diff = float(np.max(np.abs(out - ref)) / np.abs(ref).max())
        print(f"| {type_name} {rows} x {k} | {tokens} | {name} | {sec * 1e6:.1f} | "
              f"{nbytes / sec / 1e12:.2f} | {diff:.1e} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="2,4,8,16,32,64,128")
    ap.add_argument("--shapes", default="8b", choices=sorted(SHAPES))
    ap.add_argument("--only", type=int, default=0, help="the first N shapes only")
    ap.add_argument("--tiles", default="", help="more tile shapes mi.ni.wm.wn.stages, comma "
                    "separated, timed at every token count")
    ap.add_argument("--no-gemm", action="store_true", help="the GEMM's default tiles only")
    args = ap.parse_args()
    extra = [T(*(int(v) for v in t.split("."))) for t in args.tiles.split(",") if t]
    pk.set_device("cuda")
    rng = np.random.default_rng(0)
    print("| shape | tokens | kernel | us | TB/s of weights | max diff / max y |\n"
          "|---|---|---|---|---|---|")
    for type_name, rows, k in SHAPES[args.shapes][:args.only or None]:
        copies = max(2, int(np.ceil(160e6 / (rows * k * BYTES_PER_VALUE[type_name]))))
        ws = [random_weights(type_name, rows, k, rng) for _ in range(copies)]
        for tokens in (int(t) for t in args.tokens.split(",")):
            bench(type_name, rows, k, tokens, ws, rng, extra, gemm=not args.no_gemm)
        del ws


if __name__ == "__main__":
    main()
