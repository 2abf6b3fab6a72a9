"""Prompts run together (`generate.prefill_together`, what `serve` does with the prompts it
admits at once) against the same prompts one after the other, on slots of one KV pool, after
the server's warm-up; and which kernels compile on the way (a specialization not in the
compile cache costs seconds, under a server's first requests).

Input: argv = SHAPE:TYPE (llm.synth; default llama-8b:Q4_K_M), env SYNTH_DIR (default /tmp),
SLOTS (default 16), LENGTHS (prompt token counts, default 15,60), ROUNDS (default 3). Output:
per prompt length, ms for SLOTS prompts one by one (the prompt graphs) and together (one
eager pass), each round; and every compile (kernel entry with its compile-time arguments,
seconds) as it happens, with the phase it happened in.

    python3 benchmarks/prompt_batches.py llama-8b:Q4_K_M
"""
import os
import sys
import time

import numpy as np

import llm
import pykernel.compiler as compiler
from llm.batching import BatchScheduler
from llm.generate import prefill_together

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from batched_decode import model_file  # noqa: E402

PHASE = ["load"]


def log_compiles() -> None:
    """Print each compile (a cache miss) in this process as it finishes."""
    compile_kernel = compiler.compile_kernel

    def logged(kernel, arch, spec, options, key=None, fresh=False):
        t0 = time.perf_counter()
        out = compile_kernel(kernel, arch, spec, options, key, fresh)
        print(f"  compiled [{PHASE[0]}] {compiler.entry_name(kernel.name, spec)} "
              f"{time.perf_counter() - t0:.2f} s", flush=True)
        return out
    compiler.compile_kernel = logged


def main(item: str) -> None:
    log_compiles()
    slots = int(os.environ.get("SLOTS", "16"))
    lengths = [int(n) for n in os.environ.get("LENGTHS", "15,60").split(",")]
    rounds = int(os.environ.get("ROUNDS", "3"))
    model = llm.load(model_file(item), device="cuda", progress=False, n_ctx=slots * 512)
    PHASE[0] = "warm-up"
    t0 = time.perf_counter()
    scheduler = BatchScheduler(model, slots=slots, warm_up=True)
    print(f"{item}: {slots} slots, warm-up {time.perf_counter() - t0:.1f} s")
    scheduler.close()
    sessions, backend = scheduler.sessions, model.backend
    rng = np.random.default_rng(0)
    print("| prompt tokens | round | one by one ms | together ms |")
    print("|---|---|---|---|")
    for n in lengths:
        for r in range(rounds):
            prompts = [rng.integers(100, 20000, n).tolist() for _ in sessions]
            PHASE[0] = f"{n} x {slots} one by one, round {r}"
            for s in sessions:
                s.reset()
            backend.synchronize()
            t0 = time.perf_counter()
            for s, p in zip(sessions, prompts):
                s.prefill(p)
            alone = time.perf_counter() - t0
            PHASE[0] = f"{n} x {slots} together, round {r}"
            for s in sessions:
                s.reset()
            backend.synchronize()
            t0 = time.perf_counter()
            prefill_together(sessions, prompts)
            together = time.perf_counter() - t0
            print(f"| {n} | {r} | {1e3 * alone:.1f} | {1e3 * together:.1f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "llama-8b:Q4_K_M")
