"""CPU runner benchmark (numpy backend): load time, prompt and decode tokens per second.

Usage: python benchmarks/cpu_runner.py [--models smollm2 gemma3-270m] [-p 128] [-n 64] [-r 3]

Like `llama-bench -p 128 -n 64`: prompt processing of p tokens in one prefill, then n decode steps
(greedy, each one forward pass of one token). Prints a markdown table with the median and the
spread over r repetitions, plus the machine's load average, since other processes on a 2-core
machine change these numbers a lot.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import llm  # noqa: E402


def bench_model(name: str, n_prompt: int, n_decode: int, reps: int) -> dict:
    path = llm.resolve_model(name)  # fetched first if needed: not part of the load time
    size = os.path.getsize(path)
    t0 = time.perf_counter()
    model = llm.load(path, n_ctx=n_prompt + n_decode + 8)
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, model.config.n_vocab - 100, n_prompt).tolist()
    pp, tg = [], []
    for _ in range(reps):
        session = model.session()
        session.reset()
        t0 = time.perf_counter()
        logits, _ = session.prefill(prompt)
        pp.append(n_prompt / (time.perf_counter() - t0))
        token = int(np.argmax(logits))
        t0 = time.perf_counter()
        for _ in range(n_decode):
            token = int(np.argmax(session.step(token)))
        tg.append(n_decode / (time.perf_counter() - t0))
    return dict(name=name, path=path, load=load_s, pp=pp, tg=tg, size=size)


def fmt(values: list[float]) -> str:
    spread = statistics.pstdev(values) if len(values) > 1 else 0.0
    return f"{statistics.median(values):.1f} ± {spread:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2", "gemma3-270m"])
    parser.add_argument("-p", type=int, default=128, help="prompt tokens")
    parser.add_argument("-n", type=int, default=64, help="decode tokens")
    parser.add_argument("-r", type=int, default=3, help="repetitions")
    args = parser.parse_args()
    rows = [bench_model(m, args.p, args.n, args.r) for m in args.models]
    print(f"device: CPU, {os.cpu_count()} cores; numpy backend; load average at the end "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    print(f"| model | file MiB | load s | pp{args.p} tok/s | tg{args.n} tok/s |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {Path(r['path']).name} | {r['size'] / 2**20:.0f} | {r['load']:.2f} | "
              f"{fmt(r['pp'])} | {fmt(r['tg'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
