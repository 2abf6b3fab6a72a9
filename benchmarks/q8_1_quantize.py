"""Q8_1 activation quantize (stdlib_kernels/quant/q8_1.py) against blocks per warp: a decode
step's vectors (1 x 4096, 1 x 14336) and a 512-token prefill's (512 x 4096, 512 x 14336).
CUDA-graph replays timed with CUDA events, inputs rotated past L2 for the prefill sizes
(blocks per warp: multiples of 4, the kernel does 4 per round);
GB/s counts f32 read + Q8_1 written.

    python3 benchmarks/q8_1_quantize.py
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks._timing import replay_seconds  # noqa: E402
from stdlib_kernels.quant.q8_1 import q8_1_bytes, quantize_q8_1_into  # noqa: E402

SHAPES = ((1, 4096), (1, 14336), (512, 4096), (512, 14336))
BLOCKS_PER_WARP = (4, 8, 16, 32)


def main():
    pk.set_device("cuda")
    rng = np.random.default_rng(0)
    print(f"device {pk.current_device().name}")
    print("| rows x n | blocks per warp | us | GB/s |")
    print("|---|---|---|---|")
    for rows, n in SHAPES:
        copies = max(1, (256 << 20) // (rows * n * 4))
        xs = [pk.to_device(rng.standard_normal((rows, n)).astype(np.float32))
              for _ in range(min(copies, 8))]
        out = pk.empty((rows, q8_1_bytes(n)), np.uint8)
        nbytes = rows * n * 4 + out.nbytes
        for u in BLOCKS_PER_WARP:
            launches = 40

            def record():
                for i in range(launches):
                    quantize_q8_1_into(xs[i % len(xs)], out, blocks_per_warp=u)
            us = replay_seconds(record) * 1e6 / launches
            print(f"| {rows} x {n} | {u} | {us:.2f} | {nbytes / us / 1e3:.0f} |", flush=True)


if __name__ == "__main__":
    main()
