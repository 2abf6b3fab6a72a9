"""stdlib_kernels._select.block_scan (the samplers' in-place prefix sum over a shared array,
each thread's contiguous chunk offset by collectives.block_scan) vs a float64 cumsum: lengths
below, at and above the block size, not multiples of it; zero weights among the values."""
import numpy as np
import pytest

import pykernel as pk
from pykernel import Const, Ptr, f32, i32
from stdlib_kernels._select import block_scan

MAX_LEN = 2048


@pk.kernel
def scan_kernel(x: Ptr[f32, "ro"], out: Ptr[f32], length: i32, BLOCK: Const[int]):
    arr = pk.shared_array(f32, MAX_LEN)
    scratch = pk.shared_array(f32, 32)
    for i in range(pk.thread_idx.x, length, BLOCK):
        arr[i] = x[i]
    pk.syncthreads()
    block_scan(arr, length, scratch, BLOCK)
    for i in range(pk.thread_idx.x, length, BLOCK):
        out[i] = arr[i]


@pytest.mark.parametrize("block,length", [(256, 1), (256, 45), (256, 256), (256, 512),
                                          (1024, 1000), (1024, 2048), (1024, 1500)])
def test_block_scan_matches_cumsum(device, rng, seed, block, length):
    w = np.exp(rng.standard_normal(length) * 3).astype(np.float32)   # softmax-like weights
    w[rng.random(length) < 0.3] = 0.0                                 # filtered-out entries
    out = pk.full(length, np.nan, np.float32)
    scan_kernel[1, block](pk.to_device(w), out, length, block)
    ref = np.cumsum(w.astype(np.float64))
    # non-negative terms: an entry's error is at most (its chain of f32 additions) x 2^-24
    # x the total; the chain: per - 1 in the chunk, 5 warp_scan, 5 over the warp totals, the
    # warp offset and the chunk offset (2)
    per = -(-length // block)
    tol = (per + 11) * 2.0**-24 * ref[-1] * (1 + 1e-3)
    got = out.numpy()
    assert np.all(np.abs(got - ref) <= tol), \
        f"seed={seed}: max error {np.max(np.abs(got - ref))} > {tol}"


def test_block_scan_ptx_assembles(assemble):
    ptx = scan_kernel.ptx("sm_90", BLOCK=1024)
    assert "shfl.sync.up.b32" in ptx and ptx.count("bar.sync") <= 6, ptx
    assemble(ptx, "sm_90")
