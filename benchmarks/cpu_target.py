"""CPU-target speed (this is what CI's kernel tests run on): a 1M-element vector add (no
synchronisation: plain loops) and a 4096 x 1024 row reduction with shared memory, shuffles and
barriers (threads as coroutines). Reports compile time separately. Usage:
PYKERNEL_DEVICE=cpu python benchmarks/cpu_target.py"""
import os
import sys
import time

import numpy as np

import pykernel as pk

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from block_reduction import row_sum  # noqa: E402
from vector_add import vector_add  # noqa: E402


def best(fn, repeats=3):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    pk.set_device("cpu")
    n = 1 << 20
    a, b = pk.to_device(np.ones(n, np.float32)), pk.to_device(np.ones(n, np.float32))
    out = pk.empty(n, np.float32)
    first = best(lambda: vector_add[n // 256, 256](a, b, out, n), 1)
    t = best(lambda: vector_add[n // 256, 256](a, b, out, n))
    print(f"vector add 1M: first call (compile+run) {first:.3f} s, run {t:.3f} s")
    rows, cols = 4096, 1024
    x = pk.to_device(np.random.default_rng(0).standard_normal((rows, cols), np.float32))
    sums = pk.empty(rows, np.float32)
    first = best(lambda: row_sum[rows, 256](x, sums, cols, 256), 1)
    t = best(lambda: row_sum[rows, 256](x, sums, cols, 256))
    print(f"row reduction 4096 x 1024 (256 threads, shuffles + barrier): first call "
          f"{first:.3f} s, run {t:.3f} s")
    print(f"worker threads: {pk.current_device().workers_n}")


if __name__ == "__main__":
    main()
