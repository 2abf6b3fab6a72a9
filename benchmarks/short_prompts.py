"""Prefill of short prompts on the GPU: time to the last logits of one forward pass of P tokens
on an empty cache (as `pykernel bench`'s ppP), for ways of running the weights' matmuls: the
shipped choice (the prefill GEMMs' short-prompt tiles: gemm_q8_k.SMALL_KTILES for the int8
GEMM, gemm.SMALL_WARPS for the f16 one), the GEMMs with their 128 x 128 tiles only (the choice
before), the other tile sets of SMALL_SETS (int8) and SMALL_WARPS (f16), and with
--gemv-tokens N the GEMV (8 tokens per launch) up to N tokens.

    python3 benchmarks/short_prompts.py MODEL.gguf [--sizes 2,8,9,16,32,64,128,512] [-r 5]
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import llm  # noqa: E402
from stdlib_kernels.quant import gemm_q8_k  # noqa: E402

gemm = importlib.import_module("stdlib_kernels.quant.gemm")   # the package exports gemm()


# other short-prompt tiles of the int8 GEMM (Q4_K, Q6_K, Q4_0, Q8_0): (at most tokens,
# (mi, ni, wm, wn, stages)); BM = 16 mi wm weight rows, BN = 8 ni wn tokens per block
SMALL_SETS = {
    "BM 64 to 256 tokens": ((16, (1, 2, 4, 1, 3)), (32, (1, 4, 4, 1, 3)),
                            (256, (1, 4, 4, 2, 3))),
    "... then BM 128 BN 64 to 256": ((16, (1, 2, 4, 1, 3)), (32, (1, 4, 4, 1, 3)),
                                     (64, (1, 4, 4, 2, 3)), (256, (2, 4, 4, 2, 3))),
    "... then BM 64 BN 128 to 256": ((16, (1, 2, 4, 1, 3)), (32, (1, 4, 4, 1, 3)),
                                     (64, (1, 4, 4, 2, 3)), (256, (1, 8, 4, 2, 3))),
}

# the f16 GEMM's (other types') short-prompt warps: (at most tokens, (WM, WN)): tiles of
# 16 WM WN rows x as many tokens
SMALL_WARPS = {
    "f16 GEMM 32 x 32 to 32, 64 x 64 to 256": ((32, (1, 2)), (256, (2, 2))),
    "f16 GEMM 64 x 64 to 256": ((256, (2, 2)),),
    "f16 GEMM 32 x 32 to 256": ((256, (1, 2)),),
}


def prompt_seconds(model, cache, ids) -> float:
    t0 = time.perf_counter()
    model.backend.to_host(model.transformer.forward_tokens(ids, 0, cache))
    return time.perf_counter() - t0


def use(model, way):
    gemv_tokens, small, warps = way
    options = model.backend.options
    model.backend.options = dataclasses.replace(options, kernels=dataclasses.replace(
        options.kernel_options, gemv_tokens=gemv_tokens))
    gemm_q8_k.SMALL_KTILES.clear()
    gemm_q8_k.SMALL_KTILES.update(small)
    gemm.SMALL_WARPS[:] = warps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--sizes", default="2,8,9,16,32,64,128,512")
    parser.add_argument("-r", type=int, default=5)
    parser.add_argument("--gemv-tokens", type=int, default=0,
                        help="also time the GEMV (8 tokens per launch) up to this many")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    model = llm.load(args.model, device="cuda", n_ctx=max(sizes) + 8, progress=False)
    cfg = model.config
    cache = model.backend.kv_cache(cfg.n_layer, max(sizes) + 8, cfg.n_head_kv, cfg.head_dim,
                                   cfg.head_dim_v)
    ids = np.random.default_rng(0).integers(0, cfg.n_vocab - 2, max(sizes))
    shipped = (model.backend.options.kernel_options.gemv_tokens, dict(gemm_q8_k.SMALL_KTILES),
               list(gemm.SMALL_WARPS))
    T = gemm_q8_k.Q8KTiles
    ways = {"shipped": shipped}
    if args.gemv_tokens > 8:
        ways[f"GEMV up to {args.gemv_tokens}"] = (args.gemv_tokens, *shipped[1:])
    ways["GEMMs' 128 x 128 tiles only"] = (8, {}, [])
    for label, sets in SMALL_SETS.items():
        ways[label] = (8, {t: [(most, T(*tiles)) for most, tiles in sets] for t in
                           ("Q4_K", "Q6_K", "Q4_0", "Q8_0")}, shipped[2])
    for label, warps in SMALL_WARPS.items():
        ways[label] = (8, shipped[1], list(warps))
    print(f"{os.path.basename(args.model)}: ms per prompt (median of {args.r}), tokens/s")
    print("| tokens | " + " | ".join(ways) + " |")
    print("|---|" + "---|" * len(ways))
    for p in sizes:
        for way in ways.values():                       # compile, allocate
            use(model, way)
            prompt_seconds(model, cache, ids[:p])
        times = {label: [] for label in ways}
        for _ in range(args.r):                         # the ways alternate (host drift)
            for label, way in ways.items():
                use(model, way)
                times[label].append(prompt_seconds(model, cache, ids[:p]))
        use(model, shipped)
        cells = [f"{1e3 * np.median(t):.2f} / {p / np.median(t):.0f}" for t in times.values()]
        print(f"| {p} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
