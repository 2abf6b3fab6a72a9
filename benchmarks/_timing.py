"""Timing shared by the benchmarks: the launches of `record()` captured once into a CUDA graph
and replayed, timed with events (no Python launch cost in the figure).

    seconds = replay_seconds(lambda: kernel[grid, block](...), replays=5, pdl=False)

`record()` runs once outside the capture first (compiles, allocates, warms up), then inside
`pk.capture_graph(stream, pdl=pdl)`; the result is GPU seconds per replay of everything
`record()` launched. Code that must do something between the capture and the timing (the
ranks of a collective meeting at a barrier) uses the two steps, `captured` and
`seconds_per_replay`."""
from __future__ import annotations

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
