"""Host-side (Python) profile of one prefill: where the CPU time of the eager launches goes.

Input: a GGUF model path, -p prompt tokens. Output: the cProfile table (top functions by own
time and by cumulative time) of `repeats` prefills after a warm-up, and the wall time per
prefill next to the GPU-synchronised time.

    python3 benchmarks/host_profile.py MODEL.gguf [-p 512] [--repeats 5] [--top 30]
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
import llm  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("-p", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    model = llm.load(args.model, device="cuda", n_ctx=args.p + 1, progress=False)
    cfg = model.config
    cache = model.backend.kv_cache(cfg.n_layer, args.p + 1, cfg.n_head_kv, cfg.head_dim,
                                   cfg.head_dim_v)
    ids = np.random.default_rng(0).integers(0, cfg.n_vocab, args.p).astype(np.int32)

    def prefill():
        return model.backend.to_host(model.transformer.forward_tokens(ids, 0, cache))

    prefill()
    pk.synchronize()
    start = time.perf_counter()
    for _ in range(args.repeats):
        prefill()
    wall = (time.perf_counter() - start) / args.repeats
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.repeats):
        prefill()
    profiler.disable()
    print(f"{args.model}: prefill of {args.p} tokens {wall * 1e3:.2f} ms wall "
          f"({args.p / wall:.0f} tokens/s), {args.repeats} repeats")
    stats = pstats.Stats(profiler).strip_dirs()
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
