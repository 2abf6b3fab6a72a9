"""Top-k candidate lists against copying logits rows (the runner's sampled steps): stdlib
`sampling.top_k_candidates` and `argmax` timed as CUDA-graph replays, then the host's view:
the call with its copies (what Backend.top_candidates pays, pageable memory here) against
copying the rows whole; and the batched device sampler (`sampling.sample_rows`, the
server's steps of unseeded top-k requests) against the candidate lists sampled on the host
(`llm.sampling.sample_among_rows`, llama.cpp's default filters).

Input: none (random N(0, 3) rows of a 128256-token vocabulary, 1 and 16 rows, k = 40).
Output: two lines per row count: us of kernels, us of call + copies, us of whole rows, and the
first rows' list lengths; us of sample_rows + its ids' copy against lists + host draws.

    python3 benchmarks/top_k_lists.py
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks._timing import replay_seconds  # noqa: E402
from llm.sampling import Sampler, sample_among_rows  # noqa: E402
from stdlib_kernels.sample_rows import ROW_PARAMS  # noqa: E402
from stdlib_kernels.sampling import (argmax, row_settings, sample_rows,  # noqa: E402
                                     top_k_candidates)

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
        samplers = [Sampler() for _ in range(rows)]     # T 0.8, top-k 40, top-p 0.95, min-p 0.05
        p = samplers[0].params
        out = pk.empty(rows, np.int32)
        pinned = pk.pinned_empty((rows, ROW_PARAMS), np.float32)
        on_device = pk.empty((rows, ROW_PARAMS), np.float32)

        def settings():
            return row_settings(rng.random(rows), temperature=p.temperature, top_k=p.top_k,
                                top_p=p.top_p, min_p=p.min_p)

        def device_draws():        # the host's settings copied synchronously
            return sample_rows(x, settings(), cap=CAP, out=out).numpy()

        def device_draws_async():  # Backend.sample_rows: an asynchronous copy, k given
            pinned[...] = settings()
            on_device.copy_from_host_async(pinned)
            return sample_rows(x, on_device, k=p.top_k, cap=CAP, out=out).numpy()

        def host_draws():
            lists()
            v, i, c = values.numpy(), ids.numpy(), counts.numpy()
            return sample_among_rows(samplers, [(v[r, :c[r]], i[r, :c[r]]) for r in range(rows)])
        device_draws()
        on_device.copy_from(settings())
        replayed = replay_seconds(lambda: sample_rows(x, on_device, k=p.top_k, cap=CAP, out=out),
                                  replays=REPEATS)
        print(f"rows {rows}: sample_rows kernels {replayed * 1e6:.1f} us (graph); call + ids "
              f"copy {host_seconds(device_draws) * 1e6:.0f} us, with the asynchronous settings "
              f"copy {host_seconds(device_draws_async) * 1e6:.0f} us; lists + copies + host "
              f"draws {host_seconds(host_draws) * 1e6:.0f} us", flush=True)


if __name__ == "__main__":
    main()
