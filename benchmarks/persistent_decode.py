"""Decode tokens per second: the persistent decode step (stdlib_kernels/persistent/decode.py,
one launch per token, f32 weights) against the runner's decode graphs, on a synthetic llama
file from `pykernel synth` (written to $SYNTH_DIR or /tmp when absent).

Input: a CUDA GPU (or --device cpu with --file, a smoke run). Output, on stdout: the graph
path's greedy tok/s (its device-token loop, wall clock), the persistent step's tok/s in a host
loop (io copy, launch, logits read back) and per launch from a captured graph replayed (CUDA
events: GPU time alone), per tile size and grid, with the GB/s of f32 weights it streams; and
how far its logits are from the runner's at the first step (the runner's Q8_1 activations and
f16 KV cache round differently: a report, not a check; --activations f32 makes them close).

    python3 benchmarks/persistent_decode.py [--shape smollm2-135m] [--type Q8_0] [--prompt 64]
        [--tokens 64] [--activations q8_1]
    python3 benchmarks/persistent_decode.py --device cpu --file tests/data/golden/tiny/tiny-llama-f32.gguf --tokens 4

The persistent step reads f32 weights (4 bytes a value: ~3.8x a Q8_0 file's bytes), so on the
same file it streams more than the graph path; the GB/s column says how close it comes to the
copy bandwidth, the comparison the issue's roofline asks for.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import llm  # noqa: E402
import pykernel as pk  # noqa: E402
from benchmarks.batched_decode import model_file  # noqa: E402
from llm.backends.persistent_decode import PersistentDecode  # noqa: E402

TILE_ROWS = (8, 16, 32)
REPLAYS = 20


def graph_tok_s(model, cache, token: int, pos: int, n: int) -> float:
    """The runner's greedy device-token loop (decode graphs), warmed up (captured) first."""
    list(model.transformer.greedy_tokens(token, pos, cache, 3))
    t0 = time.perf_counter()
    got = list(model.transformer.greedy_tokens(token, pos, cache, n))
    return len(got) / (time.perf_counter() - t0)


def persistent_rows(model, cache, token: int, pos: int, n: int, device: str, ref):
    """(tile rows, grid, host-loop tok/s, GPU us per launch, GB/s) per configuration."""
    n_ctx = pos + n + 1
    for tile in TILE_ROWS:
        pd = PersistentDecode.from_model(model, n_ctx=n_ctx, tile_rows=tile)
        grids = [pd.runner.grid]
        if device == "cuda":
            from stdlib_kernels._launch import multiprocessors
            grids = sorted({pd.runner.grid, multiprocessors(), 2 * multiprocessors()})
        nbytes = pd.runner.sched.weight_elems * 4
        for grid in grids:
            pd.runner.grid = grid
            pd.load_cache(cache, pos)
            first = pd.step(token, pos)
            if ref is not None:
                err = np.abs(first - ref).max() / max(1e-30, np.abs(ref).max())
                same = int(np.argmax(first)) == int(np.argmax(ref))
                print(f"  tile {tile} grid {grid}: first-step logits max |diff| / max|ref| "
                      f"{err:.2e}, same argmax {same}", flush=True)
            t0 = time.perf_counter()
            for k in range(n):
                pd.step(token, pos + k)
            host = n / (time.perf_counter() - t0)
            gpu_s = float("nan")
            if device == "cuda":
                from benchmarks._timing import replay_seconds
                gpu_s = replay_seconds(pd.runner.launch, REPLAYS)
            yield tile, grid, host, gpu_s * 1e6, nbytes / gpu_s / 1e9
        del pd


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="smollm2-135m")
    parser.add_argument("--type", default="Q8_0")
    parser.add_argument("--file", default=None, help="a llama-arch GGUF instead of a synth")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--activations", default="q8_1", choices=("q8_1", "f32"))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args()
    path = Path(args.file) if args.file else model_file(f"{args.shape}:{args.type}")
    n_ctx = args.prompt + 2 * args.tokens + 8
    model = llm.load(path, device=args.device, backend="kernels", n_ctx=n_ctx, progress=False,
                     activations=args.activations)
    cfg, b = model.config, model.backend
    print(f"{path.name} on {pk.current_device().name}: {cfg.n_layer} layers, n_embd "
          f"{cfg.n_embd}, vocab {cfg.n_vocab}; prompt {args.prompt}, {args.tokens} tokens; "
          f"runner activations {args.activations}", flush=True)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, cfg.n_vocab, args.prompt).tolist()
    cache = b.kv_cache(cfg.n_layer, n_ctx, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v)
    logits = b.to_host(model.transformer.forward_tokens(prompt, 0, cache))[-1]
    token, pos = int(np.argmax(logits)), len(prompt)
    ref = b.to_host(model.transformer.forward_tokens([token], pos, cache))[-1]
    graph = graph_tok_s(model, cache, token, pos, args.tokens)
    print("| path | tile rows | grid | tok/s (host loop) | GPU us per token | GB/s |")
    print("|---|---|---|---|---|---|")
    print(f"| decode graphs (greedy device loop) | - | - | {graph:.1f} | "
          f"{1e6 / graph:.1f} (wall) | - |", flush=True)
    for tile, grid, host, us, gbs in persistent_rows(model, cache, token, pos, args.tokens,
                                                     args.device, ref):
        print(f"| persistent step | {tile} | {grid} | {host:.1f} | {us:.1f} | {gbs:.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
