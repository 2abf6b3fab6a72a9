"""The merge loop BPE and SPM share: repeatedly merge the adjacent pair with the best priority
(lowest key; leftmost among equal keys) until no pair has one.

Input: the starting symbols and `priority(a, b) -> key | None` (None: the pair never merges).
Output: the merged symbols. A heap of candidate pairs with lazy deletion keeps it O(n log n)."""
from __future__ import annotations

import heapq
from typing import Callable


def merge_adjacent(symbols: list[str], priority: Callable[[str, str], object]) -> list[str]:
    n = len(symbols)
    if n < 2:
        return symbols
    next_index = list(range(1, n + 1))
    next_index[-1] = -1
    prev_index = list(range(-1, n - 1))
    heap = []
    for i in range(n - 1):
        key = priority(symbols[i], symbols[i + 1])
        if key is not None:
            heap.append((key, i, symbols[i] + symbols[i + 1]))
    heapq.heapify(heap)
    alive: list[str | None] = list(symbols)
    while heap:
        _, left, merged = heapq.heappop(heap)
        right = next_index[left]
        # An entry is stale once either side has changed since it was pushed.
        if alive[left] is None or right < 0 or alive[left] + alive[right] != merged:
            continue
        alive[left] = merged
        alive[right] = None
        next_index[left] = next_index[right]
        if next_index[left] >= 0:
            prev_index[next_index[left]] = left
        for a in (prev_index[left], left):
            b = next_index[a] if a >= 0 else -1
            if a >= 0 and b >= 0:
                key = priority(alive[a], alive[b])
                if key is not None:
                    heapq.heappush(heap, (key, a, alive[a] + alive[b]))
    return [s for s in alive if s is not None]
