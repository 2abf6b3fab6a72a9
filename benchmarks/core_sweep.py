"""Geometry sweep for the core kernels at batch 512 (GPU): the per-thread work caps that
choose the defaults, timed the same way as benchmarks/core_kernels.py.

Input: none (needs a GPU). Output: a markdown table on stdout, one row per (kernel, hidden),
one column per setting: register-row kernels (rmsnorm, layernorm, softmax) with at most 4 / 8 /
16 four-element units per thread (norm.RMSNORM_CHUNKS, LAYERNORM_CHUNKS, softmax's
SOFTMAX_CHUNKS); elementwise kernels with 1 / 2 / 4 / 8 units per thread
(activations.GLU_UNITS, elementwise.BINARY_UNITS).

    python3 benchmarks/core_sweep.py
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import core_kernels as ck  # noqa: E402

import pykernel as pk  # noqa: E402
from stdlib_kernels import _rows, activations, elementwise, norm, row_softmax  # noqa: E402

ROW_KERNELS = ("rmsnorm", "rmsnorm+residual", "layernorm", "softmax")
ELEMENTWISE = ("silu_mul", "add", "convert f32->f16")


def set_row_chunks(chunks: int) -> None:
    """Cap every register-row kernel at `chunks` units per thread (layernorm included)."""
    _rows.MAX_CHUNKS = max(chunks, 8)
    row_softmax.SOFTMAX_CHUNKS = norm.RMSNORM_CHUNKS = norm.LAYERNORM_CHUNKS = chunks


def measure(name: str, hidden: int, rng, copy_bw: float) -> str:
    case = {c[0]: c for c in ck.cases(512, hidden, rng)}[name]
    _, make, nbytes = case
    calls = [make() for _ in range(max(1, min(64, ck.ROTATE_BYTES // nbytes)))]
    seconds = ck.time_graph(calls)
    return f"{seconds * 1e6:.2f} us, {100 * nbytes / seconds / copy_bw:.0f}%"


def main() -> None:
    pk.set_device("cuda")
    rng = np.random.default_rng(0)
    copy_bw = ck.copy_bandwidth()
    print(f"device: {pk.current_device()}; copy {copy_bw / 1e12:.2f} TB/s\n")
    defaults = (_rows.MAX_CHUNKS, row_softmax.SOFTMAX_CHUNKS, norm.RMSNORM_CHUNKS,
                norm.LAYERNORM_CHUNKS)
    print("| kernel | hidden | 4 units | 8 units | 16 units |\n|---|---|---|---|---|")
    for name in ROW_KERNELS:
        for hidden in (2048, 4096, 8192):
            cells = []
            for chunks in (4, 8, 16):
                set_row_chunks(chunks)
                cells.append(measure(name, hidden, rng, copy_bw))
            print(f"| {name} | {hidden} | " + " | ".join(cells) + " |", flush=True)
    _rows.MAX_CHUNKS, row_softmax.SOFTMAX_CHUNKS, norm.RMSNORM_CHUNKS, \
        norm.LAYERNORM_CHUNKS = defaults
    print("\n| kernel | hidden | 1 unit | 2 units | 4 units | 8 units |\n|---|---|---|---|---|---|")
    for name in ELEMENTWISE:
        for hidden in (2048, 4096, 8192):
            cells = []
            for units in (1, 2, 4, 8):
                activations.GLU_UNITS = elementwise.BINARY_UNITS = units
                cells.append(measure(name, hidden, rng, copy_bw))
            print(f"| {name} | {hidden} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
