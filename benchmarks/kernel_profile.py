"""Where the runner's GPU time goes: per-kernel time of one prefill and of decode steps.

Input: a GGUF model path (e.g. a `pykernel synth` file), -p prompt tokens. Output: markdown
tables, one row per kernel name: launches, total us, share.
Default method: every launch is bracketed by two CUDA events recorded on the launch's own
stream (a wrapper around CudaDevice.launch); the figures are event-to-event GPU times, so each
includes that launch's own start-up (~1-2 us). `--cupti` instead traces with torch.profiler
(CUPTI kernel records: device time of each kernel, also inside replayed CUDA graphs) and times
the real decode graph: its replays' wall time against the sum of its kernels' times gives the
gaps between kernels, and "us added to the path" what each kernel adds after the end of the
ones before it (where the step's time goes when kernels overlap under PDL; it leaves out the
idle time between replays and gaps where no kernel runs).

`--batch N` (with --cupti): the batched decode step of N sequences (what `serve --parallel N`
runs: Transformer.forward_batch over slots of one pool, each holding DEPTH tokens, then all
rows' logits into the backend's reused page-locked buffer, as the scheduler reads them), its
wall time per step against its kernels' device time.

    python3 benchmarks/kernel_profile.py MODEL.gguf [-p 512] [--cupti [-d DEPTH] [--batch N]]
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
import llm  # noqa: E402
from pykernel.runtime.cuda import CudaDevice, _stream_handle  # noqa: E402


class LaunchTimer:
    """Context manager: records (name, start event, end event) around every CUDA launch."""

    def __init__(self):
        self.records = []

    def __enter__(self):
        from cuda.bindings import driver as cu
        original = CudaDevice.launch
        records = self.records

        def timed(device, compiled, grid, block, args, stream=None, shared_bytes=0):
            handle = device._launch_handle if stream is None else _stream_handle(stream)
            start, end = (cu.cuEventCreate(0)[1] for _ in range(2))
            cu.cuEventRecord(start, handle)
            original(device, compiled, grid, block, args, stream, shared_bytes)
            cu.cuEventRecord(end, handle)
            records.append((compiled.name, start, end))

        self._original, CudaDevice.launch = original, timed
        return self

    def __exit__(self, *exc):
        CudaDevice.launch = self._original

    def table(self) -> str:
        from cuda.bindings import driver as cu
        pk.synchronize()
        totals, counts = defaultdict(float), defaultdict(int)
        for name, start, end in self.records:
            totals[name] += cu.cuEventElapsedTime(start, end)[1] * 1e3
            counts[name] += 1
            cu.cuEventDestroy(start)
            cu.cuEventDestroy(end)
        whole = sum(totals.values())
        rows = ["| kernel | launches | total us | share |", "|---|---|---|---|"]
        for name in sorted(totals, key=totals.get, reverse=True):
            rows.append(f"| {name} | {counts[name]} | {totals[name]:.1f} | "
                        f"{100 * totals[name] / whole:.1f}% |")
        rows.append(f"| all | {sum(counts.values())} | {whole:.1f} | 100% |")
        return "\n".join(rows)


def cupti_table(run, reps: int) -> str:
    """Kernel device times of `reps` calls of run(), traced by CUPTI through torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.init()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run()
        pk.synchronize()
    totals, counts, added = defaultdict(float), defaultdict(int), defaultdict(float)
    kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"),
                     key=lambda e: e.time_range.start)
    last_end = None
    for event in kernels:
        totals[event.name] += event.device_time_total / reps
        counts[event.name] += 1
        # the time this kernel adds to the stream's critical path: from the latest end of the
        # kernels before it to its own end (under PDL kernels start early and overlap, so
        # their durations include waiting; these sum to the calls' device wall time)
        end = event.time_range.end
        if last_end is not None and last_end < end:
            added[event.name] += min(end - last_end, end - event.time_range.start) / reps
        last_end = end if last_end is None else max(last_end, end)
    whole = sum(totals.values())
    rows = ["| kernel | launches per call | us per call | share | us added to the path |",
            "|---|---|---|---|---|"]
    for name in sorted(totals, key=totals.get, reverse=True)[:25]:
        rows.append(f"| {name[:60]} | {counts[name] / reps:g} | {totals[name]:.1f} | "
                    f"{100 * totals[name] / whole:.1f}% | {added[name]:.1f} |")
    rows.append(f"| all kernels | {sum(counts.values()) / reps:g} | {whole:.1f} | 100% | "
                f"{sum(added.values()):.1f} |")
    return "\n".join(rows)


def graph_decode_profile(model, args):
    """The captured decode graph (greedy, from an empty cache): wall time per token and the
    device time of its kernels."""
    t = model.transformer
    cfg = model.config
    cache = model.backend.kv_cache(cfg.n_layer, args.depth + 160, cfg.n_head_kv, cfg.head_dim,
                                   cfg.head_dim_v)
    if args.depth:                                     # random tokens already in the cache
        ids = np.random.default_rng(1).integers(0, cfg.n_vocab - 2, args.depth)
        model.backend.to_host(t.forward_tokens(ids, 0, cache))
    t.greedy(1, args.depth, cache, 4)                  # capture
    step = cache.graph
    start, end = pk.Event(), pk.Event()
    pk.synchronize()
    start.record(model.backend.stream)
    for _ in range(100):
        step.graph.replay()
    end.record(model.backend.stream)
    wall = start.elapsed_ms(end) * 1e3 / 100
    table = cupti_table(step.graph.replay, 20)
    print(f"\n{os.path.basename(args.model)}: decode graph replay at depth {args.depth}, "
          f"{wall:.1f} us per token (GPU wall)\n\n{table}", flush=True)


def batched_decode_profile(model, args):
    """The batched decode step of args.batch sequences (graph per batch size, as the scheduler
    runs it), with and without the logits' copy to the host."""
    import time
    from llm.generate import Session
    cfg, t, b = model.config, model.transformer, model.backend
    n_ctx = args.depth + 64
    caches = b.kv_caches(args.batch, cfg.n_layer, n_ctx, cfg.n_head_kv, cfg.head_dim,
                         cfg.head_dim_v)
    rng = np.random.default_rng(args.batch)
    sessions = [Session(t, b, n_ctx, cache=c) for c in caches]
    for s in sessions:
        s.prefill(rng.integers(0, cfg.n_vocab - 2, args.depth).tolist())
    ids = rng.integers(0, cfg.n_vocab - 2, args.batch)
    positions = np.full(args.batch, args.depth)

    def forward():
        return t.forward_batch(ids, positions, [s.cache for s in sessions])

    for _ in range(3):                                 # compile, capture
        b.to_host(forward())
    for label, run in (("step with the logits to the host",
                        lambda: b.to_host_reused(forward())),
                       ("step on the device only", forward)):
        b.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            run()
        b.synchronize()
        print(f"{os.path.basename(args.model)}: batch {args.batch}, {label}: "
              f"{(time.perf_counter() - t0) / 20 * 1e3:.2f} ms (host wall)", flush=True)
    print(f"\n{cupti_table(lambda: b.to_host_reused(forward()), 5)}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("-p", type=int, default=512)
    parser.add_argument("--cupti", action="store_true")
    parser.add_argument("-d", "--depth", type=int, default=0,
                        help="--cupti: decode with this many tokens already in the cache")
    parser.add_argument("--batch", type=int, default=0,
                        help="--cupti: profile the batched decode step of this many sequences")
    args = parser.parse_args()
    if args.cupti and args.batch:
        model = llm.load(args.model, device="cuda", n_ctx=args.depth + 64, progress=False)
        batched_decode_profile(model, args)
        return
    if args.cupti:
        model = llm.load(args.model, device="cuda", n_ctx=max(args.p, args.depth + 160) + 8,
                         progress=False)
        graph_decode_profile(model, args)
        cfg, t = model.config, model.transformer
        cache = model.backend.kv_cache(cfg.n_layer, args.p + 8, cfg.n_head_kv, cfg.head_dim,
                                       cfg.head_dim_v)
        ids = np.random.default_rng(0).integers(0, cfg.n_vocab - 2, args.p)
        prefill = lambda: model.backend.to_host(t.forward_tokens(ids, 0, cache))  # noqa: E731
        prefill()
        print(f"\nprefill of {args.p} tokens\n\n{cupti_table(prefill, 3)}", flush=True)
        return
    model = llm.load(args.model, device="cuda", n_ctx=args.p + 8, progress=False)
    cfg, t = model.config, model.transformer
    cache = model.backend.kv_cache(cfg.n_layer, args.p + 8, cfg.n_head_kv, cfg.head_dim,
                                   cfg.head_dim_v)
    ids = np.random.default_rng(0).integers(0, cfg.n_vocab - 2, args.p)
    model.backend.use_graphs = False    # profile the decode step's launches one by one
    model.backend.to_host(t.forward_tokens(ids, 0, cache))         # warm-up: compile, allocate
    model.backend.to_host(t.forward_tokens(ids[:1], args.p, cache))
    prefill = lambda: t.forward_tokens(ids, 0, cache)            # noqa: E731
    decode = lambda: t.forward_tokens(ids[:1], args.p, cache)    # noqa: E731
    for title, run in (("prefill of %d tokens" % args.p, prefill),
                       ("one decode step (eager)", decode)):
        with LaunchTimer() as timer:
            model.backend.to_host(run())
        print(f"\n{os.path.basename(args.model)}: {title}\n\n{timer.table()}", flush=True)


if __name__ == "__main__":
    main()
