"""Does the L1 / shared-memory split explain why decode attention streams its K/V more slowly
than a bare read of the same bytes? (issue 6: the 8B shape, 32 q / 8 KV heads, D 128, f16,
one sequence.) The driver's preferred shared-memory carveout is set on the loaded decode and
read kernels (-1: the driver's default; 0: the most L1; 100: the most shared memory, leaving
the least L1 for loads in flight), then the split kernel alone, split + combine, and
benchmarks/read_floor.py's bare read of 16.8 MB are timed as in attention_splits.py (CUDA
events around graph replays, each launch reading its own copy out of >= 256 MB).

    KV=4096 python3 benchmarks/decode_carveout.py
"""
import os
import sys

import numpy as np
from cuda.bindings import driver as cu

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks import read_floor  # noqa: E402
from benchmarks.attention_splits import SHAPES, caches, decode_us  # noqa: E402
from stdlib_kernels.attention.decode_plan import config_splits, default_config  # noqa: E402

CARVEOUT = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
READ_GEOMETRIES = [(256, 1, 8), (256, 4, 8), (1024, 1, 8)]   # read_floor's (threads, per SM, loads)


def set_carveout(prefix: str, percent: int) -> None:
    """On every loaded kernel whose name starts with prefix (graphs captured after this use it)."""
    for kernel in pk.current_device()._kernels.values():
        if kernel.name.startswith(prefix):
            err, = cu.cuFuncSetAttribute(kernel.func, CARVEOUT, percent)
            if err != cu.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"{kernel.name}: carveout {percent}: {err}")


def main():
    pk.set_device("cuda")
    shape = SHAPES["llama-8b"]
    n_head, n_kv, head_dim = shape
    kv_len = int(os.environ.get("KV", "4096"))
    copies = caches(n_kv, kv_len, head_dim)
    config = default_config(n_head // n_kv, head_dim, dtype=np.float16)
    splits = config_splits(config, n_head, n_kv, kv_len)
    bufs = read_floor.buffers(16_777_216)
    print(f"device: {pk.current_device().name}, kv_len {kv_len}, {splits} splits")
    for percent in (-1, 0, 100, 50):
        if percent >= 0:            # the first round loads the kernels with the default
            set_carveout("decode_mma", percent)
            set_carveout("read_sum", percent)
        cells = []
        for _ in range(2):
            alone = [decode_us(shape, kv_len, splits, pdl, copies, split_only=True)
                     for pdl in (False, True)]
            full = [decode_us(shape, kv_len, splits, pdl, copies) for pdl in (False, True)]
            cells.append(f"split alone {alone[0]:.2f} / {alone[1]:.2f} | "
                         f"split + combine {full[0]:.2f} / {full[1]:.2f}")
        for geometry in READ_GEOMETRIES:
            cells.append(f"read {geometry} {read_floor.read_us(bufs, geometry, 0, False):.2f}")
        print(f"carveout {percent} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
