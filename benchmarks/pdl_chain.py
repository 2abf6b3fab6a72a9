"""Programmatic dependent launch (PDL) in CUDA graphs: GPU time per kernel of a chain of
dependent launches, captured with plain edges and with `pk.capture_graph(stream, pdl=True)`.

Input: none (needs an sm_90+ GPU). Output: a markdown table on stdout.
Method: LAUNCHES launches captured into one graph, each reading what the previous one wrote;
the replay is timed with CUDA events (5 replays after a warm-up). Cases: an empty-ish kernel
(one block: pure launch gap), decode-sized kernels (rmsnorm 1 x 4096, silu_mul 1 x 14336), and
a bandwidth-sized one (add 512 x 4096) where only the tail overlaps.

    python3 benchmarks/pdl_chain.py
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks._timing import replay_seconds  # noqa: E402
import stdlib_kernels as sk  # noqa: E402
from pykernel import Ptr, f32, i32  # noqa: E402

LAUNCHES = 400


@pk.kernel
def bump(x: Ptr[f32, "ro"], y: Ptr[f32], n: i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        y[i] = x[i] + 1.0


@pk.kernel
def bump_early(x: Ptr[f32, "ro"], y: Ptr[f32], n: i32):
    pk.launch_dependents()        # trigger at entry instead of after the body
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        y[i] = x[i] + 1.0


def time_chain(launch_pair, pdl: bool) -> float:
    """Microseconds per launch of LAUNCHES launches (launch_pair(k) issues launch k)."""
    def record():
        for k in range(LAUNCHES):
            launch_pair(k)
    return replay_seconds(record, 5, pdl) * 1e6 / LAUNCHES


def cases(rng):
    def ping_pong(make, fn):
        a, b = make(), make()
        return lambda k: fn(a, b) if k % 2 == 0 else fn(b, a)

    def f32s(shape):
        return lambda: pk.to_device(rng.standard_normal(shape).astype(np.float32))

    w4096 = pk.to_device(rng.standard_normal(4096).astype(np.float32))
    tiny = ping_pong(f32s(32), lambda a, b: bump[1, 32](a, b, 32))
    tiny_early = ping_pong(f32s(32), lambda a, b: bump_early[1, 32](a, b, 32))
    n_big = 512 * 4096
    big_early = ping_pong(f32s(n_big), lambda a, b: bump_early[n_big // 256, 256](a, b, n_big))
    norm = ping_pong(f32s((1, 4096)), lambda a, b: sk.rmsnorm(a, w4096, 1e-6, out=b))
    up = f32s((1, 14336))()
    glu = ping_pong(f32s((1, 14336)), lambda a, b: sk.silu_mul(a, up, out=b))
    big_b = f32s((512, 4096))()
    add = ping_pong(f32s((512, 4096)), lambda a, b: sk.add(a, big_b, out=b))
    return [("bump, 1 block of 32", tiny), ("bump, trigger at entry", tiny_early),
            ("bump 512 x 4096, trigger at entry (16 MB)", big_early), ("rmsnorm 1 x 4096", norm),
            ("silu_mul 1 x 14336", glu), ("add 512 x 4096 (24 MB)", add)]


def main():
    pk.set_device("cuda")
    dev = pk.current_device()
    rng = np.random.default_rng(0)
    print(f"device: {dev}; {LAUNCHES} dependent launches per graph\n")
    print("| kernel chain | plain graph us/launch | PDL graph us/launch | saved us |")
    print("|---|---|---|---|")
    for name, launch in cases(rng):
        plain, pdl = time_chain(launch, False), time_chain(launch, True)
        print(f"| {name} | {plain:.2f} | {pdl:.2f} | {plain - pdl:.2f} |")


if __name__ == "__main__":
    main()
