"""Launches from several Python threads on the CPU device at once: each launch runs on launch
contexts and packed arguments of its own, so concurrent launches of different kernels, and of
one kernel with different arguments, all give their own results (bit-exact against numpy)."""
import threading

import numpy as np
import pytest

import pykernel as pk
from pykernel import Ptr, f32, i32

pytestmark = pytest.mark.usefixtures("cpu_device")

BLOCK = 128
ROUNDS = 60


@pk.kernel
def scaled_sum(x: Ptr[f32], y: Ptr[f32], out: Ptr[f32], a: f32, n: i32):
    i = pk.block_idx.x * BLOCK + pk.thread_idx.x
    if i < n:
        out[i] = a * x[i] + y[i]


@pk.kernel
def block_max(x: Ptr[f32], out: Ptr[f32], n: i32):
    """One block per row of BLOCK elements: out[row] = max of the row (a barrier, so the CPU
    target runs it as coroutines with shared memory and exchange slots per worker)."""
    buf = pk.shared_array(f32, BLOCK)
    t = pk.thread_idx.x
    i = pk.block_idx.x * BLOCK + t
    buf[t] = x[i] if i < n else -3.0e38
    pk.syncthreads()
    step = BLOCK // 2
    while step > 0:
        if t < step:
            buf[t] = max(buf[t], buf[t + step])
        pk.syncthreads()
        step //= 2
    if t == 0:
        out[pk.block_idx.x] = buf[0]


def _run_scaled_sum(rng, n, failures):
    for _ in range(ROUNDS):
        x, y = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
        a = np.float32(rng.standard_normal())
        out = pk.to_device(np.full(n, np.nan, np.float32))
        scaled_sum[-(-n // BLOCK), BLOCK](x, y, out, a, n)
        if not np.array_equal(out.numpy(), a * x + y):
            failures.append(f"scaled_sum n={n}")


def _run_block_max(rng, n, failures):
    rows = -(-n // BLOCK)
    for _ in range(ROUNDS):
        x = rng.standard_normal(n, np.float32)
        out = pk.to_device(np.full(rows, np.nan, np.float32))
        block_max[rows, BLOCK](x, out, n)
        padded = np.full(rows * BLOCK, -3.0e38, np.float32)
        padded[:n] = x
        if not np.array_equal(out.numpy(), padded.reshape(rows, BLOCK).max(axis=1)):
            failures.append(f"block_max n={n}")


def _in_threads(jobs):
    failures, errors = [], []

    def guarded(job, *args):
        try:
            job(*args, failures)
        except Exception as exc:     # noqa: BLE001 - reported by the test, not lost
            errors.append(exc)
    threads = [threading.Thread(target=guarded, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert not failures, failures[:5]


def test_two_threads_launch_different_kernels(seed):
    # 40001 elements: a grid large enough that each launch also splits over the workers
    _in_threads([(_run_scaled_sum, np.random.default_rng(seed), 40001),
                 (_run_block_max, np.random.default_rng(seed + 1), 4501)])


def test_two_threads_launch_one_kernel_with_different_arguments(seed):
    _in_threads([(_run_scaled_sum, np.random.default_rng(seed), 45),
                 (_run_scaled_sum, np.random.default_rng(seed + 1), 40001),
                 (_run_block_max, np.random.default_rng(seed + 2), 65)])
