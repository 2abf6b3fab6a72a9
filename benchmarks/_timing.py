"""Timing shared by the benchmarks: the launches of `record()` captured once into a CUDA graph
and replayed, timed with events (no Python launch cost in the figure).

    seconds = replay_seconds(lambda: kernel[grid, block](...), replays=5, pdl=False)

`record()` runs once outside the capture first (compiles, allocates, warms up), then inside
`pk.capture_graph(stream, pdl=pdl)`; the result is GPU seconds per replay of everything
`record()` launched."""
from __future__ import annotations

import pykernel as pk


def replay_seconds(record, replays: int = 5, pdl: bool = False) -> float:
    stream = pk.Stream()
    record()
    pk.synchronize()
    with pk.capture_graph(stream, pdl=pdl) as graph:
        record()
    graph.replay(stream)
    stream.synchronize()
    start, end = pk.Event(), pk.Event()
    start.record(stream)
    for _ in range(replays):
        graph.replay(stream)
    end.record(stream)
    end.synchronize()
    return start.elapsed_ms(end) * 1e-3 / replays
