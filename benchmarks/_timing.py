"""Timing shared by the benchmarks: the launches of `record()` captured once into a CUDA graph
and replayed, timed with events (no Python launch cost in the figure).

    seconds = replay_seconds(lambda: kernel[grid, block](...), replays=5, pdl=False)

`record()` runs once outside the capture first (compiles, allocates, warms up), then inside
`pk.capture_graph(stream, pdl=pdl)`; the result is GPU seconds per replay of everything
`record()` launched. Code that must do something between the capture and the timing (the
ranks of a collective meeting at a barrier) uses the two steps, `captured` and
`seconds_per_replay`.

Host-side costs (a launch's Python, no GPU time) are timed in batches instead:

    samples = host_us_per_call(lambda: kernel[grid, block](...), batch=200, batches=60)
"""
from __future__ import annotations

import time

import pykernel as pk


def replay_seconds(record, replays: int = 5, pdl: bool = False) -> float:
    stream = pk.Stream()
    record()
    pk.synchronize()
    return seconds_per_replay(captured(record, stream, pdl), stream, replays)


def captured(record, stream, pdl: bool = False):
    """The launches of `record()` captured into a CUDA graph on `stream`, replayed once (the
    first replay uploads the graph: it stays out of the timed ones)."""
    with pk.capture_graph(stream, pdl=pdl) as graph:
        record()
    graph.replay(stream)
    stream.synchronize()
    return graph


def seconds_per_replay(graph, stream, replays: int) -> float:
    """GPU seconds per replay of `graph`, `replays` of them back to back between two events."""
    start, end = pk.Event(), pk.Event()
    start.record(stream)
    for _ in range(replays):
        graph.replay(stream)
    end.record(stream)
    end.synchronize()
    return start.elapsed_ms(end) * 1e-3 / replays


def host_us_per_call(call, batch: int, batches: int, after_batch=None) -> list[float]:
    """Host microseconds per `call()`, one sample per batch of `batch` back-to-back calls;
    `after_batch()` (untimed) runs after each, e.g. a synchronize so that launches queued by
    one batch do not slow the next."""
    samples = []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(batch):
            call()
        samples.append((time.perf_counter() - start) / batch * 1e6)
        if after_batch is not None:
            after_batch()
    return samples
