"""Decode tokens per second: the persistent decode step (stdlib_kernels/persistent/, one launch
per token, weights in their GGUF formats, Q8_1 inputs, the runner's f16 KV cache) against the
runner's layer graphs, on the same file: a synthetic llama from `pykernel synth` (written to
$SYNTH_DIR or /tmp when absent) or --file.

Input: a CUDA GPU (or --device cpu with --file, a smoke run). Output, on stdout: for each path
(RunnerOptions.persistent_decode off / on) the greedy device-token loop's tok/s (wall clock,
the same GraphRunner.greedy_tokens loop: a replayed graph per token, the argmax in it) and
whether the two paths pick the same tokens and how far their first-step logits are apart;
then the persistent launch alone per tile size and grid from a captured graph replayed (CUDA
events: GPU time), with the GB/s of weights it streams (the step's weight buffer: the GGUF
bytes the graphs read too) and that as a fraction of --copy-gbs (the issue's roofline). Tile
"plan" is the model's own choice (stdlib_kernels/persistent/decode_plan.py: rows per tile per
stage, attention splits; the runner's default), 8 / 16 / 32 uniform tiles beside it (with the
plan's attention splits).
--profile adds, per tile size, the profiling build's launch (globaltimer stamps per item,
stdlib_kernels/persistent/decode_profile.py) after a warm-up launch: the launch's time per
stage (embed; per layer qkv_in, qkv, attn, o, gate_up_in, gate_up, down; lm_head_in,
lm_head: the *_in stages are the QUANT items writing a matrix's Q8_1 input once, absent where
the stage before writes it (gate_up's items the down projection's as its blocks complete; up
to decode_schedule.FOLD_NORM_BLOCKS blocks, e.g. SmolLM2's, the last o / down / embed item
the normed ones), attn the
split attention with the RoPE, the KV write and the merge fused in), the items' waits and how
late a waiting block noticed its dependency.

    python3 benchmarks/persistent_decode.py [--shape llama-8b] [--type Q4_K_M] [--prompt 64]
        [--tokens 128] [--copy-gbs 4300] [--profile]
    python3 benchmarks/persistent_decode.py --device cpu \\
        --file tests/data/golden/tiny/tiny-llama-q8_0.gguf --tokens 4
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
from stdlib_kernels.persistent.decode_profile import (  # noqa: E402
    format_profile,
    profile_summary,
)
from llm.options import RunnerOptions  # noqa: E402

TILE_ROWS = (None, 8, 16, 32)     # None: the model's plan (decode_plan.plan_items)
REPLAYS = 20


def load(path: Path, device: str, n_ctx: int, persistent: bool):
    return llm.load(path, device=device, backend="kernels", n_ctx=n_ctx, progress=False,
                    options=RunnerOptions.from_env(persistent_decode=persistent))


def prefilled(model, prompt):
    """A fresh cache with `prompt` prefilled by the runner; (cache, first token, its logits
    row after one decode step of it)."""
    cfg, b, gr = model.config, model.backend, model.transformer
    cache = b.kv_cache(cfg.n_layer, model.n_ctx, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v)
    token = int(np.argmax(b.to_host(gr.forward_tokens(prompt, 0, cache))[-1]))
    return cache, token


def greedy_run(model, prompt, n: int):
    """(tok/s of the greedy device loop after a warm-up run (captures), its tokens, the first
    decode step's logits)."""
    gr = model.transformer
    cache, token = prefilled(model, prompt)
    first = model.backend.to_host(gr.decode_step(token, len(prompt), cache)).reshape(-1)
    list(gr.greedy_tokens(token, len(prompt), cache, 3))
    t0 = time.perf_counter()
    tokens = list(gr.greedy_tokens(token, len(prompt), cache, n))
    return len(tokens) / (time.perf_counter() - t0), tokens, first


def launch_rows(model, prompt, device: str, copy_gbs: float):
    """(tile rows, grid, GPU us per launch, GB/s, fraction of copy_gbs) per configuration."""
    cache, token = prefilled(model, prompt)
    io = pk.to_device(np.array([token, len(prompt)], np.int32))
    grids = [None]
    if device == "cuda":
        from stdlib_kernels._launch import multiprocessors
        grids += [multiprocessors(), 2 * multiprocessors()]
    buffer = None
    for tile in TILE_ROWS:
        for grid in grids:
            pd = PersistentDecode.from_parts(*_parts(model), model.n_ctx, tile, grid,
                                             np.dtype(cache.dtype), weights_buffer=buffer)
            buffer = pd.runner.weights[0]
            pd.attach(cache)
            nbytes = pd.runner.sched.weight_bytes
            if device != "cuda":
                pd.launch(io)
                yield tile, pd.runner.grid, float("nan"), float("nan"), float("nan")
                continue
            from benchmarks._timing import replay_seconds
            seconds = replay_seconds(lambda pd=pd: pd.launch(io), REPLAYS)
            gbs = nbytes / seconds / 1e9
            yield tile, pd.runner.grid, seconds * 1e6, gbs, gbs / copy_gbs


def profile_tables(model, prompt, device: str):
    """(tile rows, the profiling build's per-kind table) per tile size: one launch after a
    warm-up one (compiles, first touches), default grid."""
    cache, token = prefilled(model, prompt)
    io = pk.to_device(np.array([token, len(prompt)], np.int32))
    buffer = None
    for tile in TILE_ROWS:
        pd = PersistentDecode.from_parts(*_parts(model), model.n_ctx, tile, None,
                                         np.dtype(cache.dtype), weights_buffer=buffer,
                                         profile=True)
        buffer = pd.runner.weights[0]
        pd.attach(cache)
        for _ in range(2):
            pd.launch(io)
        if device == "cuda":
            pk.synchronize()
        rows, totals = profile_summary(pd.runner.sched, pd.runner.profile())
        yield tile, pd.runner.grid, format_profile(rows, totals)


def _parts(model):
    t = getattr(model.transformer, "model", model.transformer)
    return t.cfg, t.spec, t.w, model.backend.activations


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="smollm2-135m")
    parser.add_argument("--type", default="Q8_0")
    parser.add_argument("--file", default=None, help="a llama-arch GGUF instead of a synth")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--copy-gbs", type=float, default=4300.0,
                        help="the device's copy bandwidth, GB/s (H200: ~4300)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--profile", action="store_true",
                        help="also the time per item kind (the kernel's profiling build)")
    args = parser.parse_args()
    path = model_file(args.file or f"{args.shape}:{args.type}")
    n_ctx = args.prompt + 2 * args.tokens + 8
    prompt = np.random.default_rng(0).integers(0, 256, args.prompt).tolist()
    runs = {}
    for persistent in (False, True):
        model = load(path, args.device, n_ctx, persistent)
        prompt = [t % model.config.n_vocab for t in prompt]
        runs[persistent] = greedy_run(model, prompt, args.tokens)
        if not persistent:
            del model
    cfg = model.config
    print(f"{path.name} on {pk.current_device().name}: {cfg.n_layer} layers, n_embd "
          f"{cfg.n_embd}, vocab {cfg.n_vocab}; prompt {args.prompt}, {args.tokens} tokens",
          flush=True)
    (g_tps, g_tok, g_first), (p_tps, p_tok, p_first) = runs[False], runs[True]
    same = next((i for i, (a, b) in enumerate(zip(g_tok, p_tok)) if a != b), None)
    err = np.linalg.norm(p_first - g_first) / np.linalg.norm(g_first)
    print(f"first-step logits rel L2 {err:.2e}; tokens "
          f"{'all equal' if same is None else f'first differ at {same}'}")
    print("| path | tile rows | grid | tok/s (greedy loop) | GPU us per launch | GB/s | "
          "of copy |")
    print("|---|---|---|---|---|---|---|")
    print(f"| layer graphs | - | - | {g_tps:.1f} | - | - | - |")
    print(f"| persistent (the runner's default) | plan | - | {p_tps:.1f} | - | - | - |",
          flush=True)
    for tile, grid, us, gbs, frac in launch_rows(model, prompt, args.device, args.copy_gbs):
        print(f"| persistent launch | {tile or 'plan'} | {grid} | - | {us:.1f} | {gbs:.0f} | "
              f"{frac:.2f} |", flush=True)
    if args.profile:
        for tile, grid, table in profile_tables(model, prompt, args.device):
            print(f"\nprofile, tile rows {tile or 'plan'}, grid {grid} (one launch, position "
                  f"{args.prompt}):\n{table}", flush=True)


if __name__ == "__main__":
    main()
