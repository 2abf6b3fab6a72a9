"""Top-k candidate lists against copying logits rows (the runner's sampled steps): stdlib
`sampling.top_k_candidates` and `argmax` timed as CUDA-graph replays, then the host's view:
the call with its copies (what Backend.top_candidates pays, pageable memory here) against
copying the rows whole.

Input: none (random N(0, 3) rows of a 128256-token vocabulary, 1 and 16 rows, k = 40).
Output: one line per row count: us of kernels, us of call + copies, us of whole rows, and the
first rows' list lengths.

    python3 benchmarks/top_k_lists.py
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks._timing import replay_seconds  # noqa: E402
from stdlib_kernels.sampling import argmax, top_k_candidates  # noqa: E402

VOCAB, K, CAP, REPEATS = 128256, 40, 1024, 50


def host_seconds(fn) -> float:
    pk.synchronize()
    t0 = time.perf_counter()
    for _ in range(REPEATS):
        fn()
    return (time.perf_counter() - t0) / REPEATS


def main() -> None:
    rng = np.random.default_rng(0)
    for rows in (1, 16):
        x = pk.to_device((rng.standard_normal((rows, VOCAB)) * 3).astype(np.float32))
        values, ids = pk.empty((rows, CAP), np.float32), pk.empty((rows, CAP), np.int32)
        counts = pk.empty(rows, np.int32)

        def lists():
            top_k_candidates(x, K, cap=CAP, values=values, ids=ids, counts=counts)
        kernels = replay_seconds(lists, replays=REPEATS)
        greedy = replay_seconds(lambda: argmax(x, out=counts), replays=REPEATS)
        lists()
        lengths = counts.numpy()[:4]
        with_copies = host_seconds(lambda: (lists(), counts.numpy(), values.numpy(),
                                            ids.numpy()))
        whole = host_seconds(x.numpy)
        print(f"rows {rows}: top_k_candidates kernels {kernels * 1e6:.1f} us (graph), argmax "
              f"{greedy * 1e6:.1f} us; call + 3 copies {with_copies * 1e6:.0f} us; whole rows "
              f"{whole * 1e6:.0f} us; list lengths {lengths.tolist()}", flush=True)


if __name__ == "__main__":
    main()
