"""stdlib_kernels._select.block_scan (the samplers' in-place prefix sum over a shared array,
each thread's contiguous chunk offset by collectives.block_scan, offsets made monotone) vs a
float64 cumsum and, bit for bit, vs its numpy model (scan_model.py): lengths below, at and
above the block size, not multiples of it; zero weights among the values. Adversarial inputs
(zero weights at chunk starts, where the plain chunked scan stepped) and search_cum driven
with targets on every step: the scan never decreases, a zero weight never steps, and every
search lands on a positive weight."""
import numpy as np
import pytest

import pykernel as pk
from pykernel import Const, Ptr, f32, i32
from stdlib_kernels._select import block_scan, search_cum
from tests.kernels import scan_model as M

MAX_LEN = 2048


@pk.func
def scan_into(x, out, arr, length: i32, BLOCK: Const[int]):
    """x's first `length` values into shared arr, block_scan over them, arr copied to out."""
    scratch = pk.shared_array(f32, 32)
    for i in range(pk.thread_idx.x, length, BLOCK):
        arr[i] = x[i]
    pk.syncthreads()
    block_scan(arr, length, scratch, BLOCK)
    for i in range(pk.thread_idx.x, length, BLOCK):
        out[i] = arr[i]


@pk.kernel
def scan_kernel(x: Ptr[f32, "ro"], out: Ptr[f32], length: i32, BLOCK: Const[int]):
    arr = pk.shared_array(f32, MAX_LEN)
    scan_into(x, out, arr, length, BLOCK)


@pytest.mark.parametrize("block,length", [(256, 1), (256, 45), (256, 256), (256, 512),
                                          (1024, 1000), (1024, 2048), (1024, 1500)])
def test_block_scan_matches_cumsum(device, rng, seed, block, length):
    w = np.exp(rng.standard_normal(length) * 3).astype(np.float32)   # softmax-like weights
    w[rng.random(length) < 0.3] = 0.0                                 # filtered-out entries
    out = pk.full(length, np.nan, np.float32)
    scan_kernel[1, block](pk.to_device(w), out, length, block)
    ref = np.cumsum(w.astype(np.float64))
    # non-negative terms: an entry's error is at most (its chain of f32 additions) x 2^-24
    # x the total; the chain: per - 1 in the chunk or 11 in the tree offset (5 warp_scan, 5
    # over the warp totals, the warp offset), then the chunk's end (1) and start + run (1).
    # An entry clamped to its chunk's end also carries the chunk's later weights that its
    # running sum absorbed (each below 2^-24 x that sum): per - 1 more.
    per = -(-length // block)
    tol = (max(per - 1, 11) + 2 + per - 1) * 2.0**-24 * ref[-1] * (1 + 1e-3)
    got = out.numpy()
    assert np.all(np.abs(got - ref) <= tol), \
        f"seed={seed}: max error {np.max(np.abs(got - ref))} > {tol}"


@pk.kernel
def scan_search_kernel(x: Ptr[f32, "ro"], out: Ptr[f32], targets: Ptr[f32, "ro"],
                       picks: Ptr[i32], length: i32, n_targets: i32, BLOCK: Const[int]):
    arr = pk.shared_array(f32, MAX_LEN)
    scan_into(x, out, arr, length, BLOCK)
    for q in range(pk.thread_idx.x, n_targets, BLOCK):
        picks[q] = search_cum(arr, length, targets[q])


def targets_on_every_step(cums, total):
    """Every value of the given scans, its float neighbours, and the total: where a search
    decides between two neighbouring entries (only those below or at the total)."""
    v = np.unique(np.concatenate(cums + [np.array([total], np.float32)]))
    v = np.unique(np.concatenate([v, np.nextafter(v, np.float32(-1)),
                                  np.nextafter(v, np.float32(np.inf))]))
    return v[(v >= 0) & (v <= total)].astype(np.float32)


@pytest.mark.parametrize("block,length", [(256, 512), (256, 2000), (1024, 2048),
                                          (1024, 1500), (32, 300)])
def test_adversarial_scan_is_monotone_and_searches_hit_weights(device, rng, seed, block,
                                                                length):
    w = M.adversarial_weights(rng, length, block)
    plain_zero_steps, plain_dips = M.zero_weight_steps(M.plain_scan(w, block), w)
    assert plain_zero_steps.size + plain_dips.size > 0, \
        f"seed={seed}: input not adversarial (the plain chunked scan has no step)"
    model = M.block_scan(w, block)
    targets = targets_on_every_step([model, M.plain_scan(w, block)], model[-1])
    out = pk.full(length, np.nan, np.float32)
    picks = pk.full(targets.size, -7, np.int32)
    scan_search_kernel[1, block](pk.to_device(w), out, pk.to_device(targets), picks, length,
                                 targets.size, block)
    got = out.numpy()
    assert np.array_equal(got.view(np.int32), model.view(np.int32)), \
        f"seed={seed}: kernel differs from its model at {np.flatnonzero(got != model)[:5]}"
    zero_steps, dips = M.zero_weight_steps(got, w)
    assert dips.size == 0, f"seed={seed}: the scan decreases at {dips[:5]}"
    assert zero_steps.size == 0, f"seed={seed}: zero weights step at {zero_steps[:5]}"
    p = picks.numpy()
    assert np.all((p >= 0) & (p < length)), f"seed={seed}: picks out of range {p.min()}"
    bad = p[w[p] <= 0]
    assert bad.size == 0, f"seed={seed}: searches picked zero weights at {bad[:5]}"
    expect = np.minimum(np.searchsorted(model, targets, side="right"), length - 1)
    at_total = targets >= model[-1]   # rounding past the total: the first entry reaching it
    expect[at_total] = np.searchsorted(model, model[-1], side="left")
    assert np.array_equal(p, expect), f"seed={seed}: search differs from searchsorted"


def test_block_scan_ptx_assembles(assemble):
    ptx = scan_kernel.ptx("sm_90", BLOCK=1024)
    assert "shfl.sync.up.b32" in ptx and ptx.count("bar.sync") <= 6, ptx
    assemble(ptx, "sm_90")
