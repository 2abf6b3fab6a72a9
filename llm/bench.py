"""`pykernel bench`: prompt-processing and decode speed of a GGUF model, llama-bench style.

Input: a model (path or name), prompt length p, generated tokens n, repetitions r, device and
backend. Output: a markdown table (model, size, params, backend, test, t/s +- stdev) like
llama-bench's. ppP = P random tokens prefilled on an empty cache as `generate` does it, in
steps of `generate.prefill_step_tokens` tokens (on the kernels backend 1024, each a replayed
graph), timed to the last logits on the host; tgN = N greedy decode steps from an empty cache
(on the kernels backend: replays of the captured decode graph, reading each token id back). With
depth D (llama-bench's -d) the cache first holds D random tokens (prefilled once, untimed) and
both tests start at position D: "pp512 @ d4096". -p, -n and -d take comma-separated lists, as
llama-bench's do. One untimed warm-up run per test compiles kernels and captures the graph.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

import llm
from llm.generate import prefill_step_tokens

GIB = 2 ** 30


@dataclass
class BenchResult:
    test: str
    tokens_per_second: list[float]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.tokens_per_second)

    @property
    def stdev(self) -> float:
        t = self.tokens_per_second
        return statistics.stdev(t) if len(t) > 1 else 0.0


def _sync(model) -> None:
    model.backend.synchronize()


def prompt_speed(model, cache, ids: np.ndarray, start: int = 0) -> float:
    """Tokens/s of prefilling ids at `start` in generate's steps (prefill_step_tokens), as
    `pykernel run` prefills a prompt."""
    step = prefill_step_tokens(model.transformer, model.backend.options)
    _sync(model)
    t0 = time.perf_counter()
    for at in range(0, len(ids), step):
        logits = model.transformer.forward_tokens(ids[at:at + step], start + at, cache)
    model.backend.to_host(logits)
    return len(ids) / (time.perf_counter() - t0)


def decode_speed(model, cache, n: int, first: int, start: int = 0) -> float:
    t = model.transformer
    _sync(model)
    t0 = time.perf_counter()
    steps = t.greedy_tokens(first, start, cache, n) if model.backend.use_graphs else None
    if steps is not None:
        for _ in steps:     # the device picks each token; the host only reads them
            pass
    else:
        token = first
        for pos in range(start, start + n):
            logits = t.forward_tokens(np.array([token]), pos, cache)
            token = int(np.argmax(model.backend.to_host(logits)[-1]))
    return n / (time.perf_counter() - t0)


def _as_list(value) -> list[int]:
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def run_bench(model, p=512, n=128, r: int = 3, seed: int = 0,
              depth: int = 0) -> list[BenchResult]:
    """The ppP test for each prompt length in p, then the tgN test for each count in n (ints or
    lists, as llama-bench's -p / -n), all at one depth: one cache, one untimed depth fill."""
    cfg, ps, ns = model.config, _as_list(p), _as_list(n)
    cache = model.backend.kv_cache(cfg.n_layer, depth + max(ps + ns) + 1, cfg.n_head_kv,
                                   cfg.head_dim, cfg.head_dim_v)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, cfg.n_vocab - 2, max(ps))
    suffix = f" @ d{depth}" if depth else ""
    if depth:         # the tests below write only positions >= depth: one fill serves all
        prompt_speed(model, cache, rng.integers(0, cfg.n_vocab - 2, depth))
    results = []
    for length in (x for x in ps if x > 0):
        prompt = ids[:length]
        prompt_speed(model, cache, prompt, depth)            # warm-up: compile, allocate
        if model.transformer.prefill_graph_max:
            prompt_speed(model, cache, prompt, depth)        # the steps' graph captures
        results.append(BenchResult(f"pp{length}{suffix}",
                                   [prompt_speed(model, cache, prompt, depth) for _ in range(r)]))
    for count in (x for x in ns if x > 0):
        first = int(ids[0]) if max(ps) else 1
        decode_speed(model, cache, min(count, 4), first, depth)  # warm-up + capture
        results.append(BenchResult(f"tg{count}{suffix}",
                                   [decode_speed(model, cache, count, first, depth)
                                    for _ in range(r)]))
    return results


def model_size(model) -> tuple[int, int]:
    """(bytes of tensor data, parameters) of the model file."""
    tensors = model.gguf.tensors.values()
    return sum(t.n_bytes for t in tensors), sum(t.n_elements for t in tensors)


def table(model, backend_label: str, results: list[BenchResult]) -> str:
    size, params = model_size(model)
    name = model.gguf.get("general.name", model.path.name if hasattr(model.path, "name")
                          else str(model.path))
    rows = ["| model | size | params | backend | test | t/s |",
            "| --- | ---: | ---: | --- | ---: | ---: |"]
    size_text = f"{size / GIB:.2f} GiB" if size >= GIB else f"{size / 2**20:.2f} MiB"
    params_text = f"{params / 1e9:.2f} B" if params >= 1e9 else f"{params / 1e6:.2f} M"
    for res in results:
        rows.append(f"| {name} | {size_text} | {params_text} | {backend_label} "
                    f"| {res.test} | {res.mean:.2f} ± {res.stdev:.2f} |")
    return "\n".join(rows)


def bench(model_path, p=512, n=128, r=3, device="cuda", backend=None, depth=0,
          **options) -> str:
    """The llama-bench-style table; p, n and depth may be lists (every p and n at every
    depth, in that order, as llama-bench runs -p 512 -n 128 -d 0,4096). One model load."""
    ps, ns, depths = _as_list(p), _as_list(n), _as_list(depth)
    if min(ps + ns + depths) < 0:
        raise ValueError(f"bench: prompt lengths, token counts and depths must be >= 0, got "
                         f"-p {ps} -n {ns} -d {depths}")
    model = llm.load(model_path, device=device, backend=backend,
                     n_ctx=max(depths) + max(ps + ns) + 1, progress=False, **options)
    results = [res for d in depths for res in run_bench(model, ps, ns, r, depth=d)]
    cache = f", {options['kv_dtype']} cache" if options.get("kv_dtype") else ""
    label = f"pykernel {model.backend.name} ({device}{cache})"
    out = table(model, label, results)
    report = model.backend.memory_report()
    if report is not None:
        from llm.backends.kernels_memory import format_report
        out += "\n\n" + format_report(report)
    return out
