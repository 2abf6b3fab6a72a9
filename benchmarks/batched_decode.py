"""Batched decode (Transformer.forward_batch, what `serve --parallel N` runs): aggregate decode
tokens per second against the number of sequences stepping together.

Input: argv = SHAPE:TYPE items of llm.synth or GGUF paths (default llama-8b:Q4_K_M
smollm2-135m:Q8_0), env
SYNTH_DIR (where synthetic files are written, default /tmp), BATCHES (default 1,2,4,8,16),
DEPTH (tokens already cached per sequence, default 512), STEPS (timed steps, default 32),
DEVICE (default cuda), POOL (default 1: the caches are slots of one pool, as the scheduler's;
0: a cache each, one attention launch per sequence).
Output: one table per model. Batch 1 is the one-sequence path (decode graph); larger batches
run forward_batch eagerly plus the logits' copy to the host, as the scheduler does. Roofline:
a step reads every weight once (file bytes) plus each sequence's KV cache; at copy bandwidth
that bounds steps per second, and tokens per second is that times the batch.

    python3 benchmarks/batched_decode.py llama-8b:Q4_K_M
"""
import os
import sys
import time
from pathlib import Path

import numpy as np

import llm
from llm.generate import Session
from llm.synth import write_synthetic

COPY_TBS = float(os.environ.get("COPY_TBS", "2.97"))   # H100 torch copy (RESULTS.md)
# 1: the sequences' caches are consecutive slots of one Backend.kv_caches pool (what the
# scheduler runs: one attention launch per layer); 0: a cache each (one launch per sequence)
POOL = os.environ.get("POOL", "1") != "0"


def model_file(item: str) -> Path:
    """A GGUF path as it is, or SHAPE:TYPE of llm.synth (written once under SYNTH_DIR)."""
    if os.path.isfile(item):
        return Path(item)
    shape, qtype = item.split(":")
    path = Path(os.environ.get("SYNTH_DIR", "/tmp")) / f"{shape}-{qtype}.gguf"
    if not path.exists():
        t0 = time.perf_counter()
        write_synthetic(shape, qtype, path)
        print(f"wrote {path} in {time.perf_counter() - t0:.0f} s", flush=True)
    return path


def kv_bytes_per_token(cfg, value_bytes: int = 2) -> int:
    return 2 * cfg.n_layer * cfg.n_head_kv * cfg.head_dim * value_bytes


def bench(model, batch: int, depth: int, steps: int) -> tuple:
    """(seconds per step, seconds of the first step, of the second) of `batch` sequences,
    each with `depth` tokens cached. A new set of sequences runs its first step eagerly and
    captures its graph on the second: what a server pays when its batch changes."""
    rng = np.random.default_rng(batch)
    cfg, n_ctx = model.config, depth + steps + 8
    caches = (model.backend.kv_caches(batch, cfg.n_layer, n_ctx, cfg.n_head_kv, cfg.head_dim,
                                      cfg.head_dim_v) if POOL else [None] * batch)
    sessions = [Session(model.transformer, model.backend, n_ctx, cache=c) for c in caches]
    for s in sessions:
        s.prefill(rng.integers(0, model.config.n_vocab, depth).tolist())
    tokens = rng.integers(0, model.config.n_vocab, (steps + 2, batch))

    def step(i: int) -> None:
        if batch == 1:
            sessions[0].step(int(tokens[i, 0]))
            return
        positions = np.array([len(s.tokens) for s in sessions])
        logits = model.transformer.forward_batch(tokens[i], positions,
                                                 [s.cache for s in sessions])
        model.backend.to_host_reused(logits)     # as the scheduler reads them
        for s, t in zip(sessions, tokens[i]):
            s.tokens.append(int(t))
    firsts = []
    for i in range(2):         # warm: kernels compiled, arenas and graphs made
        t0 = time.perf_counter()
        step(i)
        model.backend.synchronize()
        firsts.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for i in range(2, steps + 2):
        step(i)
    model.backend.synchronize()
    return (time.perf_counter() - t0) / steps, *firsts


def main(items: list) -> None:
    batches = [int(b) for b in os.environ.get("BATCHES", "1,2,4,8,16").split(",")]
    depth = int(os.environ.get("DEPTH", "512"))
    steps = int(os.environ.get("STEPS", "32"))
    for item in items:
        path = model_file(item)
        model = llm.load(path, device=os.environ.get("DEVICE", "cuda"), progress=False,
                         n_ctx=depth + steps + 8)
        weights = path.stat().st_size
        print(f"\n{item}: {weights / 1e9:.2f} GB, {depth} tokens cached per sequence, "
              f"{steps} steps, {'one pool' if POOL else 'a cache each'}; roofline at "
              f"{COPY_TBS} TB/s", flush=True)
        print("| batch | ms / step | tok/s | x batch 1 | roofline tok/s | of roofline | "
              "1st / 2nd step ms |")
        print("|---|---|---|---|---|---|---|")
        base = None
        for batch in batches:
            seconds, first, second = bench(model, batch, depth, steps)
            tps = batch / seconds
            base = base or tps
            read = weights + batch * depth * kv_bytes_per_token(model.config)
            roof = batch * COPY_TBS * 1e12 / read
            print(f"| {batch} | {seconds * 1e3:.2f} | {tps:.0f} | {tps / base:.2f} | "
                  f"{roof:.0f} | {tps / roof:.0%} | {first * 1e3:.0f} / {second * 1e3:.0f} |",
                  flush=True)
        del model


if __name__ == "__main__":
    main(sys.argv[1:] or ["llama-8b:Q4_K_M", "smollm2-135m:Q8_0"])
