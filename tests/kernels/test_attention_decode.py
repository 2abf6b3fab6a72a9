"""Decode attention (stdlib_kernels.attention) against the float64 numpy reference, on the CPU
target and on CUDA: every head_dim, GQA ratios 1/3/4/8 and multi-query, f16 and f32 caches,
sliding window and soft-capping, kv_len 1 and lengths off the tile, split-K with combine,
batched sequences of different lengths, graph replay with lengths read from the device, and
(GPU) a PDL graph whose previous kernel writes the new token's row while the decode starts."""
import dataclasses

import numpy as np
import pytest

import pykernel as pk
from pykernel import Const, Ptr, i32
from stdlib_kernels import attention
from stdlib_kernels.attention.decode import DecodeWorkspace, KeyRange, launch_decode
from stdlib_kernels.attention.decode_plan import (DecodeConfig, bulk_config, config_splits,
                                                  default_config, direct_config, gpu_config,
                                                  mma_config)
from stdlib_kernels.attention.reference import decode_reference, relative_l2
from tests.launch_helpers import launched_by

TOLERANCE = {np.float16: 5e-3, np.float32: 1e-4}

# (n_head, n_kv_head, head_dim, cache dtype, max kv_len, window, softcap, splits); kv_len and
# max_len are drawn per run. Chosen so each head_dim, ratio, dtype and option appears.
CASES = [
    (4, 4, 64, np.float32, 40, None, None, 1),       # ratio 1
    (6, 2, 80, np.float16, 70, None, None, 3),       # ratio 3, D not a power of two
    (4, 1, 96, np.float32, 50, 16, None, 2),         # multi-query, sliding window
    (8, 2, 128, np.float16, 90, None, 30.0, 4),      # ratio 4, softcap
    (8, 1, 256, np.float16, 30, 7, 20.0, 2),         # ratio 8 (multi-query), both options
    (2, 2, 128, np.float32, 1, None, None, 1),       # kv_len 1
    (3, 1, 64, np.float16, 20, None, None, 5),       # more splits than some ranges need
]


def _random_problem(rng, n_head, n_kv_head, head_dim, dtype, max_kv, max_len=None):
    kv_len = int(rng.integers(1, max_kv + 1))
    max_len = max_len or kv_len + int(rng.integers(0, 9))
    q = rng.standard_normal((n_head, head_dim)).astype(np.float32)
    k = rng.standard_normal((n_kv_head, max_len, head_dim)).astype(dtype)
    v = rng.standard_normal((n_kv_head, max_len, head_dim)).astype(dtype)
    return q, k, v, kv_len


def _check(actual, expected, dtype, seed, what):
    err = relative_l2(actual, expected)
    assert np.isfinite(actual).all() and err < TOLERANCE[dtype], \
        f"{what}: relative L2 error {err:.3g} (seed {seed})"


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"h{c[0]}kv{c[1]}d{c[2]}")
def test_decode_matches_reference(device, rng, seed, case):
    n_head, n_kv_head, head_dim, dtype, max_kv, window, softcap, splits = case
    q, k, v, kv_len = _random_problem(rng, n_head, n_kv_head, head_dim, dtype, max_kv)
    scale = head_dim ** -0.5
    out = pk.full((1, n_head, head_dim), np.nan, np.float32)
    workspace = DecodeWorkspace.allocate(1, n_head, head_dim, splits) if splits > 1 else None
    launch_decode(pk.to_device(q[None]), pk.to_device(k), pk.to_device(v),
                  KeyRange(pk.to_device(np.array([kv_len], np.int32)), window=window), out,
                  scale, softcap=softcap, workspace=workspace)
    expected = decode_reference(q, k, v, kv_len, scale, window, softcap)
    _check(out.numpy()[0], expected, dtype, seed, f"kv_len {kv_len} {case}")


@pytest.mark.parametrize("fused", [True, False], ids=["one_launch", "two_launches"])
def test_split_combine_variants(device, rng, seed, fused):
    """The last-block combine (counters) and the separate combine kernel agree with the
    reference, twice in a row: the last block must leave its counter at zero."""
    q, k, v, _ = _random_problem(rng, 8, 2, 64, np.float32, 1, max_len=60)
    q_dev, k_dev, v_dev = pk.to_device(q[None]), pk.to_device(k), pk.to_device(v)
    workspace = DecodeWorkspace.allocate(1, 8, 64, 4, fused=fused)
    for kv_len in (int(rng.integers(20, 61)), int(rng.integers(1, 20))):
        out = pk.full((1, 8, 64), np.nan, np.float32)
        launch_decode(q_dev, k_dev, v_dev, KeyRange(pk.to_device(np.array([kv_len], np.int32))),
                      out, 0.125, workspace=workspace)
        _check(out.numpy()[0], decode_reference(q, k, v, kv_len, 0.125), np.float32, seed,
               f"fused={fused} kv_len {kv_len}")
        if fused:
            assert not workspace.counters.numpy().any(), f"counters not reset (seed {seed})"


# GPU-like configurations on every device (kept to two: CPU compile time of unrolled code):
# 2 heads per block with the last block combining (f16), 2 keys per row group (f32); both a
# 3-stage register ring that wraps several times per split and at most 16 lanes per key row
DEEP_RING = [(np.float16, DecodeConfig(2, 2, 1, 16, 3), True),
             (np.float32, DecodeConfig(1, 2, 2, 16, 3), False)]


@pytest.mark.parametrize("dtype,config,fused", DEEP_RING, ids=["f16_fused", "f32_two"])
def test_deep_ring_config(device, rng, seed, dtype, config, fused):
    q, k, v, kv_len = _random_problem(rng, 4, 2, 64, dtype, 60)
    out = pk.full((1, 4, 64), np.nan, np.float32)
    workspace = DecodeWorkspace.allocate(1, 4, 64, 2, fused=fused)
    launch_decode(pk.to_device(q[None]), pk.to_device(k), pk.to_device(v),
                  KeyRange(pk.to_device(np.array([kv_len], np.int32))), out, 0.125,
                  workspace=workspace, config=config)
    _check(out.numpy()[0], decode_reference(q, k, v, kv_len, 0.125), dtype, seed,
           f"kv_len {kv_len} {config} fused {fused}")


# the tensor-core kernel (f16, head_dim % 32 == 0), on every device (mma and movmatrix are
# emulated on the CPU target): GQA 4 with a 3-stage ring, GQA 3 (3 of 8 mma columns) with window
# and soft-capping in one launch, and 2 sequences of one launch with head_dim 96 (NP = 3)
MMA_CASES = [(8, 2, 64, None, None, mma_config(4, 64, warps=2, stages=3), 3, False, 1),
             (6, 2, 64, 20, 30.0, mma_config(3, 64, warps=2), 4, True, 1),
             (4, 1, 96, None, None, mma_config(4, 96, warps=1, stages=1), 2, False, 2)]


# early_kv: blocks whose keys end two rows before the newest load their first tiles before the
# PDL wait; a direct launch of the tensor-core kernel also loads the rows before kv_len - 2
# early and the newest ones, per lane, after the wait. The CPU target runs that path too
# (kernels run one after another there).
EARLY_CASES = [(np.float16, mma_config(4, 64, warps=2, stages=2)),
               (np.float32, DecodeConfig(2, 2, 2, 16, 2))]


@pytest.mark.parametrize("dtype,config", EARLY_CASES, ids=["mma_f16", "simt_f32"])
def test_early_kv_path(device, rng, seed, dtype, config):
    n_head, n_kv_head, head_dim, max_len = 8, 2, 64, 150
    q = rng.standard_normal((n_head, head_dim)).astype(np.float32)
    k = rng.standard_normal((n_kv_head, max_len, head_dim)).astype(dtype)
    v = rng.standard_normal((n_kv_head, max_len, head_dim)).astype(dtype)
    q_dev, k_dev, v_dev = pk.to_device(q[None]), pk.to_device(k), pk.to_device(v)
    # 1-2 keys: nothing loads early; 98: the last split loads after the wait; random lengths;
    # 3 splits and one (a direct launch: the tensor-core kernel loads all but the newest rows
    # before the wait, those per lane after it)
    for workspace in (DecodeWorkspace.allocate(1, n_head, head_dim, 3), None):
        for kv_len in (1, 2, 3, 4, 98, int(rng.integers(5, max_len + 1))):
            out = pk.full((1, n_head, head_dim), np.nan, np.float32)
            launch_decode(q_dev, k_dev, v_dev,
                          KeyRange(pk.to_device(np.array([kv_len], np.int32))), out, 0.125,
                          workspace=workspace, config=config, early_kv=True)
            _check(out.numpy()[0], decode_reference(q, k, v, kv_len, 0.125), dtype, seed,
                   f"early_kv kv_len {kv_len} {config} workspace {workspace is not None}")


@pytest.mark.parametrize("splits,config", [(1, DecodeConfig(1, 2, 1)), (1, DecodeConfig(2, 2, 1)),
                                           (3, DecodeConfig(2, 2, 1)),
                                           (1, mma_config(2, 64, warps=4)),
                                           (1, direct_config(mma_config(2, 64, warps=2)))],
                         ids=["direct_kernel", "direct_two_rounds", "combine_kernel",
                              "direct_mma", "direct_mma_one_head"])
def test_decode_writes_q8_1_activations(device, rng, seed, splits, config):
    """xq_out: the output as Q8_1, byte for byte what quantize_q8_1 gives for the f32 output,
    whichever launch writes it (the combine kernel; the split kernel of a one-split launch,
    in one or more rounds of its warps); 2 sequences, 4 heads of 64."""
    from stdlib_kernels.quant.q8_1 import q8_1_bytes, quantize_q8_1
    n_seq, n_head, n_kv_head, head_dim, max_len = 2, 4, 2, 64, 40
    q = rng.standard_normal((n_seq, n_head, head_dim)).astype(np.float32)
    k = rng.standard_normal((n_seq, n_kv_head, max_len, head_dim)).astype(np.float16)
    v = rng.standard_normal((n_seq, n_kv_head, max_len, head_dim)).astype(np.float16)
    lens = rng.integers(1, max_len + 1, size=n_seq).astype(np.int32)
    out = pk.full((n_seq, n_head, head_dim), np.nan, np.float32)
    xq = pk.full((n_seq, q8_1_bytes(n_head * head_dim)), 0xAB, np.uint8)
    workspace = DecodeWorkspace.allocate(n_seq, n_head, head_dim, splits) if splits > 1 else None
    launch_decode(pk.to_device(q), pk.to_device(k), pk.to_device(v),
                  KeyRange(pk.to_device(lens)), out, 0.125, workspace=workspace, config=config,
                  xq_out=xq)
    for z in range(n_seq):
        _check(out.numpy()[z], decode_reference(q[z], k[z], v[z], int(lens[z]), 0.125),
               np.float16, seed, f"sequence {z} kv_len {lens[z]}")
    expected = quantize_q8_1(out.numpy().reshape(n_seq, -1)).numpy()
    assert np.array_equal(xq.numpy(), expected), f"Q8_1 output differs (seed {seed})"
    with pytest.raises(ValueError, match="xq_out"):
        launch_decode(pk.to_device(q), pk.to_device(k), pk.to_device(v),
                      KeyRange(pk.to_device(lens)), out, 0.125, workspace=workspace,
                      xq_out=pk.empty((n_seq, 10), np.uint8))


# the runner's short-context launch (direct_config: one query head per block, one split) at
# the head_dims of its models: SmolLM2 / gpt2 64, llama / qwen 128, Gemma 3 256 (window and
# soft-capping there), with early_kv and the Q8_1 output
DIRECT_SHAPES = [(64, None, None), (128, None, None), (256, 7, 30.0)]


@pytest.mark.parametrize("head_dim,window,softcap", DIRECT_SHAPES,
                         ids=[f"d{d}" for d, _, _ in DIRECT_SHAPES])
def test_direct_config_decode(device, rng, seed, head_dim, window, softcap):
    from stdlib_kernels.quant.q8_1 import q8_1_bytes, quantize_q8_1
    n_head, n_kv_head, max_len = 8, 2, 40
    config = direct_config(mma_config(4, head_dim, warps=2 if device.kind == "cpu" else 8))
    assert config.heads_per_block == 1
    q = rng.standard_normal((n_head, head_dim)).astype(np.float32)
    k, v = (rng.standard_normal((n_kv_head, max_len, head_dim)).astype(np.float16)
            for _ in range(2))
    q_dev, k_dev, v_dev = pk.to_device(q[None]), pk.to_device(k), pk.to_device(v)
    for kv_len in (1, 3, int(rng.integers(4, max_len + 1))):
        out = pk.full((1, n_head, head_dim), np.nan, np.float32)
        xq = pk.full((1, q8_1_bytes(n_head * head_dim)), 0xAB, np.uint8)
        launch_decode(q_dev, k_dev, v_dev,
                      KeyRange(pk.to_device(np.array([kv_len], np.int32)), window=window), out,
                      0.125, softcap=softcap, config=config, early_kv=True, xq_out=xq)
        _check(out.numpy()[0], decode_reference(q, k, v, kv_len, 0.125, window, softcap),
               np.float16, seed, f"direct_config D {head_dim} kv_len {kv_len}")
        expected = quantize_q8_1(out.numpy().reshape(1, -1)).numpy()
        assert np.array_equal(xq.numpy(), expected), \
            f"Q8_1 output differs, D {head_dim} kv_len {kv_len} (seed {seed})"


def test_one_split_launch_quantizes_in_the_split_kernel(device, rng):
    """A one-split launch writes its Q8_1 output itself (from the merge's registers, however
    many rounds of its warps the rows take): one launch, no quantize launch after it; and
    direct_config puts one query head in each block."""
    n_head, n_kv_head, head_dim, kv_len = 4, 2, 64, 20
    q = pk.to_device(rng.standard_normal((1, n_head, head_dim)).astype(np.float32))
    k, v = (pk.to_device(rng.standard_normal((1, n_kv_head, 24, head_dim)).astype(np.float16))
            for _ in range(2))
    lens = pk.to_device(np.array([kv_len], np.int32))
    out = pk.empty((1, n_head, head_dim), np.float32)
    xq = pk.empty((1, n_head * head_dim // 32 * 36), np.uint8)
    grouped = mma_config(2, head_dim, warps=2)
    for config in (grouped, direct_config(grouped)):
        names = launched_by(lambda: launch_decode(q, k, v, KeyRange(lens), out, 0.125,
                                                  config=config, xq_out=xq))
        assert len(names) == 1, (config, names)
    assert direct_config(grouped).heads_per_block == 1
    assert direct_config(gpu_config(2, head_dim)) == gpu_config(2, head_dim)   # SIMT: as is


@pytest.mark.parametrize("case", MMA_CASES, ids=["gqa4_ring3", "gqa3_window_cap_fused",
                                                 "d96_two_sequences"])
def test_tensor_core_decode(device, rng, seed, case):
    n_head, n_kv_head, head_dim, window, softcap, config, splits, fused, n_seq = case
    max_len = 2 * 16 * config.warps * config.stages + 20      # the longest wraps the ring
    lens = rng.integers(1, max_len + 1, size=n_seq).astype(np.int32)
    lens[0] = int(rng.integers(max_len - 20, max_len + 1))
    q = rng.standard_normal((n_seq, n_head, head_dim)).astype(np.float32)
    k = rng.standard_normal((n_seq, n_kv_head, max_len, head_dim)).astype(np.float16)
    v = rng.standard_normal((n_seq, n_kv_head, max_len, head_dim)).astype(np.float16)
    for split_count in (1, splits):
        out = pk.full((n_seq, n_head, head_dim), np.nan, np.float32)
        workspace = (DecodeWorkspace.allocate(n_seq, n_head, head_dim, split_count,
                                              fused=fused) if split_count > 1 else None)
        launch_decode(pk.to_device(q), pk.to_device(k), pk.to_device(v),
                      KeyRange(pk.to_device(lens), window=window), out, head_dim ** -0.5,
                      softcap=softcap, workspace=workspace, config=config)
        for z in range(n_seq):
            expected = decode_reference(q[z], k[z], v[z], int(lens[z]), head_dim ** -0.5,
                                        window, softcap)
            _check(out.numpy()[z], expected, np.float16, seed,
                   f"sequence {z} kv_len {lens[z]} splits {split_count} {case}")


# the bulk-copy kernel (decode_bulk: K/V tiles copied into shared memory; the CPU target
# emulates the copies and mbarriers): GQA 4 over 2 warps' rings of 2, GQA 3 with window and
# soft-capping over one warp's ring of 3 combined in the last block, 2 sequences of head_dim 96
# with a ring of 1; each with early_kv on and off (on: rows before the newest are copied before
# the wait, the newest into the same stage after it)
BULK_CASES = [(8, 2, 64, None, None, bulk_config(4, 64, warps=2, stages=2), 3, False, 1),
              (6, 2, 64, 20, 30.0, bulk_config(3, 64, warps=1, stages=3), 4, True, 1),
              (4, 1, 96, None, None, bulk_config(4, 96, warps=2, stages=1), 2, False, 2)]


@pytest.mark.parametrize("case", BULK_CASES, ids=["gqa4_ring2", "gqa3_window_cap_fused",
                                                  "d96_two_sequences"])
def test_bulk_copy_decode(device, rng, seed, case):
    n_head, n_kv_head, head_dim, window, softcap, config, splits, fused, n_seq = case
    max_len = 2 * 16 * config.warps * config.stages + 20      # the longest wraps the ring
    q = rng.standard_normal((n_seq, n_head, head_dim)).astype(np.float32)
    k = rng.standard_normal((n_seq, n_kv_head, max_len, head_dim)).astype(np.float16)
    v = rng.standard_normal((n_seq, n_kv_head, max_len, head_dim)).astype(np.float16)
    k[..., -5:, :] = np.nan           # rows past every length: never read into a result
    v[..., -5:, :] = np.nan
    q_dev, k_dev, v_dev = pk.to_device(q), pk.to_device(k), pk.to_device(v)
    for lengths in ([1] * n_seq, [2] * n_seq, rng.integers(1, max_len - 4, size=n_seq)):
        lens = np.asarray(lengths, np.int32)
        for split_count in (1, splits):
            for early_kv in (False, True):
                out = pk.full((n_seq, n_head, head_dim), np.nan, np.float32)
                workspace = (DecodeWorkspace.allocate(n_seq, n_head, head_dim, split_count,
                                                      fused=fused) if split_count > 1 else None)
                launch_decode(q_dev, k_dev, v_dev, KeyRange(pk.to_device(lens), window=window),
                              out, head_dim ** -0.5, softcap=softcap, workspace=workspace,
                              config=config, early_kv=early_kv)
                for z in range(n_seq):
                    expected = decode_reference(q[z], k[z], v[z], int(lens[z]),
                                                head_dim ** -0.5, window, softcap)
                    _check(out.numpy()[z], expected, np.float16, seed,
                           f"sequence {z} kv_len {lens[z]} splits {split_count} early_kv "
                           f"{early_kv} {case}")


def test_bulk_copy_decode_limits(device):
    """The bulk-copy kernel reads f16 caches only, at most BULK_MAX_WARPS warps."""
    q = pk.to_device(np.zeros((1, 4, 64), np.float32))
    out = pk.empty((1, 4, 64), np.float32)
    lens = pk.to_device(np.array([3], np.int32))
    k32 = pk.to_device(np.zeros((1, 16, 64), np.float32))
    with pytest.raises(ValueError, match="bulk-copy kernel needs an f16 cache"):
        launch_decode(q, k32, k32, KeyRange(lens), out, 1.0, config=bulk_config(4, 64))
    k16 = pk.to_device(np.zeros((1, 16, 64), np.float16))
    with pytest.raises(ValueError, match="1...4 warps"):
        launch_decode(q, k16, k16, KeyRange(lens), out, 1.0, config=bulk_config(4, 64, warps=8))


# cluster merge (one launch, the split blocks of a head group as a thread-block cluster):
# 2 sequences x GQA 4 (2 heads per block: two blocks per KV head) with window + softcap, and
# one sequence of GQA 3 with head_dim 96; split counts up to the 16-block cluster
CLUSTER_CASES = [(2, 8, 2, 64, 20, 30.0, mma_config(2, 64, warps=2), (2, 5, 8)),
                 (1, 6, 2, 96, None, None, mma_config(3, 96, warps=1, stages=1), (3, 16))]


@pytest.mark.parametrize("case", CLUSTER_CASES, ids=["gqa4_two_seqs_window_cap", "d96_gqa3"])
def test_cluster_merge_decode(device, rng, seed, case):
    from stdlib_kernels.quant.q8_1 import q8_1_bytes, quantize_q8_1
    n_seq, n_head, n_kv_head, head_dim, window, softcap, config, split_counts = case
    max_len = 300
    lens = rng.integers(1, max_len + 1, size=n_seq).astype(np.int32)
    lens[0] = max_len - int(rng.integers(0, 5))
    q = rng.standard_normal((n_seq, n_head, head_dim)).astype(np.float32)
    k = rng.standard_normal((n_seq, n_kv_head, max_len, head_dim)).astype(np.float16)
    v = rng.standard_normal((n_seq, n_kv_head, max_len, head_dim)).astype(np.float16)
    q_dev, k_dev, v_dev, lens_dev = (pk.to_device(a) for a in (q, k, v, lens))
    for splits in split_counts:
        out = pk.full((n_seq, n_head, head_dim), np.nan, np.float32)
        xq = pk.full((n_seq, q8_1_bytes(n_head * head_dim)), 0xAB, np.uint8)
        workspace = DecodeWorkspace.allocate(n_seq, n_head, head_dim, splits, cluster=True)
        launch_decode(q_dev, k_dev, v_dev, KeyRange(lens_dev, window=window), out,
                      head_dim ** -0.5, softcap=softcap, workspace=workspace, config=config,
                      xq_out=xq)
        for z in range(n_seq):
            expected = decode_reference(q[z], k[z], v[z], int(lens[z]), head_dim ** -0.5,
                                        window, softcap)
            _check(out.numpy()[z], expected, np.float16, seed,
                   f"cluster of {splits}: sequence {z} kv_len {lens[z]}")
        want = quantize_q8_1(out.numpy().reshape(n_seq, -1)).numpy()
        assert np.array_equal(xq.numpy(), want), f"Q8_1 output differs (seed {seed})"


def test_cluster_merge_limits(device):
    with pytest.raises(ValueError, match=r"2\.\.\.16 splits"):
        DecodeWorkspace.allocate(1, 8, 64, 17, cluster=True)
    ws = DecodeWorkspace.allocate(1, 8, 64, 4, cluster=True)
    q = pk.to_device(np.zeros((1, 8, 64), np.float32))
    kv = pk.to_device(np.zeros((2, 40, 64), np.float32))
    with pytest.raises(ValueError, match="cluster merge needs the tensor-core kernel"):
        launch_decode(q, kv, kv, KeyRange(pk.to_device(np.array([40], np.int32))),
                      pk.empty((1, 8, 64), np.float32), 0.125, workspace=ws,
                      config=DecodeConfig(2, 2, 1))


def test_decode_contract_api(device, rng, seed):
    q, k, v, kv_len = _random_problem(rng, 8, 2, 64, np.float16, 100)
    out = attention.decode(q, k, v, kv_len, 0.125, window=None, softcap=None)
    assert out.shape == (8, 64) and isinstance(out, np.ndarray)
    _check(out, decode_reference(q, k, v, kv_len, 0.125), np.float16, seed, "decode()")


def test_batched_decode_different_lengths(device, rng, seed):
    """Three sequences, one launch: a (n_seq, n_kv_head, max_len, D) cache and a length table."""
    n_seq, n_head, n_kv_head, head_dim, max_len = 3, 4, 2, 64, 48
    lens = np.array([1, 47, int(rng.integers(2, 48))], np.int32)
    q = rng.standard_normal((n_seq, n_head, head_dim)).astype(np.float32)
    k = rng.standard_normal((n_seq, n_kv_head, max_len, head_dim)).astype(np.float16)
    v = rng.standard_normal((n_seq, n_kv_head, max_len, head_dim)).astype(np.float16)
    out = pk.full((n_seq, n_head, head_dim), np.nan, np.float32)
    workspace = DecodeWorkspace.allocate(n_seq, n_head, head_dim, 3)
    launch_decode(pk.to_device(q), pk.to_device(k), pk.to_device(v),
                  KeyRange(pk.to_device(lens)), out, 0.125, workspace=workspace)
    got = out.numpy()
    for s in range(n_seq):
        _check(got[s], decode_reference(q[s], k[s], v[s], int(lens[s]), 0.125), np.float16,
               seed, f"sequence {s} of length {lens[s]}")


def test_graph_replay_reads_length_from_device(device, rng, seed):
    """Captured once, replayed with new positions: kv_len is read from device memory."""
    n_head, n_kv_head, head_dim, max_len = 4, 1, 64, 40
    q = rng.standard_normal((n_head, head_dim)).astype(np.float32)
    k = rng.standard_normal((n_kv_head, max_len, head_dim)).astype(np.float16)
    v = rng.standard_normal((n_kv_head, max_len, head_dim)).astype(np.float16)
    pos = pk.to_device(np.array([0], np.int32))      # position of the new token
    q_dev, k_dev, v_dev = pk.to_device(q[None]), pk.to_device(k), pk.to_device(v)
    out = pk.full((1, n_head, head_dim), np.nan, np.float32)
    workspace = DecodeWorkspace.allocate(1, n_head, head_dim, 2)
    stream = pk.Stream()
    launch_decode(q_dev, k_dev, v_dev, KeyRange(pos, add=1, window=9), out, 0.125,
                  workspace=workspace)                 # warm-up: load kernels before capture
    with pk.capture_graph(stream) as graph:
        launch_decode(q_dev, k_dev, v_dev, KeyRange(pos, add=1, window=9), out, 0.125,
                      workspace=workspace, stream=stream)
    for position in (0, 5, int(rng.integers(6, max_len))):
        pos.copy_from(np.array([position], np.int32))
        graph.replay(stream)
        stream.synchronize()
        expected = decode_reference(q, k, v, position + 1, 0.125, window=9)
        _check(out.numpy()[0], expected, np.float16, seed, f"replay at position {position}")


def test_bad_shapes_are_reported(device):
    q = pk.zeros((1, 4, 64), np.float32)
    k = pk.zeros((3, 16, 64), np.float16)
    with pytest.raises(ValueError, match="n_head a multiple of n_kv_head"):
        launch_decode(q, k, k, KeyRange(pk.zeros(1, np.int32)), pk.zeros((1, 4, 64)), 1.0)
    k = pk.zeros((2, 16, 64), np.float16)
    with pytest.raises(TypeError, match="keys must be a KeyRange"):   # the old positional lens
        launch_decode(q, k, k, pk.zeros(1, np.int32), pk.zeros((1, 4, 64)), 1.0)
    with pytest.raises(ValueError, match="kv_len 17"):
        attention.decode(np.zeros((4, 64), np.float32), np.zeros((1, 16, 64), np.float16),
                         np.zeros((1, 16, 64), np.float16), 17, 1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("n_head,n_kv_head", [(8, 8), (12, 4), (16, 4), (32, 4), (4, 1)])
def test_gpu_decode_all_shapes(rng, seed, head_dim, dtype, n_head, n_kv_head):
    pk.set_device("cuda")
    for window, softcap in ((None, None), (300, 50.0)):
        q, k, v, kv_len = _random_problem(rng, n_head, n_kv_head, head_dim, dtype, 1500)
        out = attention.decode(q, k, v, kv_len, head_dim ** -0.5, window, softcap)
        expected = decode_reference(q, k, v, kv_len, head_dim ** -0.5, window, softcap)
        _check(out, expected, dtype, seed, f"kv_len {kv_len} window {window} cap {softcap}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_gpu_decode_long_context(rng, seed, dtype):
    pk.set_device("cuda")
    q, k, v, _ = _random_problem(rng, 32, 8, 128, dtype, 1, max_len=8192)
    for kv_len in (8192, 8192 - int(rng.integers(1, 200))):
        out = attention.decode(q, k, v, kv_len, 128 ** -0.5)
        _check(out, decode_reference(q, k, v, kv_len, 128 ** -0.5), dtype, seed,
               f"long context {kv_len}")


@pytest.mark.gpu
def test_gpu_bulk_decode_long_context(rng, seed):
    """decode_bulk in every shape its benchmark sweeps (attention_splits.BULK_SWEEP), 8B
    shape, 8k keys and a length off the tile, with its planned splits."""
    from benchmarks.attention_splits import BULK_SWEEP
    pk.set_device("cuda")
    q, k, v, _ = _random_problem(rng, 32, 8, 128, np.float16, 1, max_len=8192)
    q_dev, k_dev, v_dev = pk.to_device(q[None]), pk.to_device(k), pk.to_device(v)
    for stages, per_sm, fused in BULK_SWEEP:
        config = bulk_config(4, 128, stages=stages, blocks_per_sm=per_sm)
        splits = config_splits(config, 32, 8, 8192)
        workspace = DecodeWorkspace.allocate(1, 32, 128, splits, fused=fused)
        for kv_len in (8192, 8192 - int(rng.integers(1, 200)), int(rng.integers(1, 300))):
            out = pk.full((1, 32, 128), np.nan, np.float32)
            launch_decode(q_dev, k_dev, v_dev,
                          KeyRange(pk.to_device(np.array([kv_len], np.int32))), out,
                          128 ** -0.5, workspace=workspace, config=config)
            _check(out.numpy()[0], decode_reference(q, k, v, kv_len, 128 ** -0.5), np.float16,
                   seed, f"bulk {config} splits {splits} fused {fused} kv_len {kv_len}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_gpu_decode_benchmarked_configs(rng, seed, dtype):
    """Every configuration the benchmark sweeps computes the same attention, in one launch and
    in two, with the default configuration among them."""
    from benchmarks.attention import SWEEP
    pk.set_device("cuda")
    q, k, v, _ = _random_problem(rng, 32, 8, 128, dtype, 1, max_len=3000)
    kv_len = int(rng.integers(2000, 3001))
    expected = decode_reference(q, k, v, kv_len, 128 ** -0.5)
    q_dev, k_dev, v_dev = pk.to_device(q[None]), pk.to_device(k), pk.to_device(v)
    lens = pk.to_device(np.array([kv_len], np.int32))
    for config in SWEEP[np.dtype(dtype).name] + [gpu_config(4, 128, dtype)]:
        for splits, fused in ((1, False), (7, False), (40, False), (7, True), (66, True)):
            out = pk.full((1, 32, 128), np.nan, np.float32)
            workspace = (DecodeWorkspace.allocate(1, 32, 128, splits, fused=fused)
                         if splits > 1 else None)
            launch_decode(q_dev, k_dev, v_dev, KeyRange(lens), out, 128 ** -0.5,
                          workspace=workspace, config=config)
            _check(out.numpy()[0], expected, dtype, seed,
                   f"{config} splits {splits} fused {fused}")


@pytest.mark.parametrize("n_head,n_kv_head,head_dim,window,softcap,splits,fused",
                         [(8, 2, 64, None, None, 3, False), (6, 2, 96, 25, 30.0, 2, True)])
def test_q8_0_cache(device, rng, seed, n_head, n_kv_head, head_dim, window, softcap, splits,
                    fused):
    """A Q8_0 KV cache (tensor-core kernel: int8 QK^T with Q in two int8 terms per 32-block)
    against the float64 reference over the dequantized cache, with the f16 cache's bound (the
    cache's own rounding is the format's, not the kernel's)."""
    from stdlib_kernels.attention.kv_q8 import dequantize_kv, quantize_kv
    n_seq, max_len = 2, 70
    lens = np.array([int(rng.integers(50, max_len + 1)), int(rng.integers(1, max_len + 1))],
                    np.int32)
    q = rng.standard_normal((n_seq, n_head, head_dim)).astype(np.float32)
    shape = (n_seq, n_kv_head, max_len, head_dim)
    k8, v8 = (quantize_kv(rng.standard_normal(shape)) for _ in range(2))
    k, v = dequantize_kv(k8), dequantize_kv(v8)
    config = mma_config(n_head // n_kv_head, head_dim, warps=2, stages=2)
    out = pk.full((n_seq, n_head, head_dim), np.nan, np.float32)
    workspace = DecodeWorkspace.allocate(n_seq, n_head, head_dim, splits, fused=fused)
    launch_decode(pk.to_device(q), k8, v8, KeyRange(pk.to_device(lens), window=window), out,
                  head_dim ** -0.5, softcap=softcap, workspace=workspace, config=config)
    for z in range(n_seq):
        expected = decode_reference(q[z], k[z], v[z], int(lens[z]), head_dim ** -0.5, window,
                                    softcap)
        err = relative_l2(out.numpy()[z], expected)
        assert np.isfinite(err) and err < TOLERANCE[np.float16], \
            f"Q8_0 cache, sequence {z} kv_len {lens[z]}: relative L2 {err:.3g} (seed {seed})"


def test_q8_0_cache_roundtrip_is_ggml(rng):
    from stdlib_kernels.attention.kv_q8 import dequantize_kv, quantize_kv
    from stdlib_kernels.quant import reference as ref
    x = rng.standard_normal((3, 5, 64)).astype(np.float32)
    cache = quantize_kv(x)
    expected = ref.dequantize(ref.quantize(x.reshape(-1, 64), "Q8_0"), "Q8_0", 64)
    np.testing.assert_array_equal(dequantize_kv(cache).reshape(-1, 64), expected)
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_kv(np.zeros((4, 40), np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("n_head,n_kv_head,head_dim", [(32, 8, 128), (4, 1, 256), (9, 3, 64)])
def test_gpu_q8_0_cache_long_context(rng, seed, n_head, n_kv_head, head_dim):
    """The Q8_0 cache through attention.decode (default configuration and splits), 8k keys."""
    from stdlib_kernels.attention.kv_q8 import dequantize_kv, quantize_kv
    pk.set_device("cuda")
    q = rng.standard_normal((n_head, head_dim)).astype(np.float32)
    shape = (n_kv_head, 8192, head_dim)
    k8, v8 = (quantize_kv(rng.standard_normal(shape)) for _ in range(2))
    k, v = dequantize_kv(k8), dequantize_kv(v8)
    for kv_len, window in ((8192, None), (8192 - int(rng.integers(1, 300)), 1000)):
        out = attention.decode(q, k8, v8, kv_len, head_dim ** -0.5, window=window)
        _check(out, decode_reference(q, k, v, kv_len, head_dim ** -0.5, window), np.float16,
               seed, f"Q8_0 cache kv_len {kv_len} window {window}")


@pk.kernel
def write_new_row(k_new: Ptr["T", "ro"], v_new: Ptr["T", "ro"], k_cache: Ptr["T"],
                  v_cache: Ptr["T"], pos: Ptr[i32, "ro"], max_len: i32, D: i32,
                  T: Const[pk.dtype]):
    """The runner's rope_qkv_cache in miniature: the new token's K/V row per KV head (block),
    with the early trigger, so in a PDL graph the decode after it starts before it writes."""
    pk.launch_dependents()
    at = (pk.block_idx.x * max_len + pos[0]) * D
    for d in range(pk.thread_idx.x, D, pk.block_dim.x):
        k_cache[at + d] = k_new[pk.block_idx.x * D + d]
        v_cache[at + d] = v_new[pk.block_idx.x * D + d]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,mode", [(d, m) for d in (np.float16, np.float32)
                                        for m in ("two_launches", "one_launch", "direct")] +
                         [(np.float16, "bulk"), (np.float16, "bulk_one_launch")])
def test_gpu_pdl_graph_sees_the_new_row(rng, seed, dtype, mode):
    """As the runner's decode graphs: a PDL graph where a kernel writes the new token's K/V row
    just before the decode, which triggers its dependents early and (early_kv) loads its first
    K/V tiles before waiting, all but the newest rows. The new key carries much of the softmax
    weight, so a decode that read its row before the write landed would be far off; replayed
    at new positions. "direct": one split (the short-context graph's launch, direct_config);
    "bulk": decode_bulk, whose copies of all but the newest row are issued before the wait."""
    pk.set_device("cuda")
    n_head, n_kv_head, head_dim, max_len = 32, 8, 128, 3000
    scale = head_dim ** -0.5
    q = rng.standard_normal((n_head, head_dim)).astype(np.float32)
    k = rng.standard_normal((n_kv_head, max_len, head_dim)).astype(dtype)
    v = rng.standard_normal((n_kv_head, max_len, head_dim)).astype(dtype)
    group = n_head // n_kv_head
    k_new = (q.reshape(n_kv_head, group, head_dim).sum(1) * 0.6).astype(dtype)
    v_new = rng.standard_normal((n_kv_head, head_dim)).astype(dtype) * 3
    q_dev, k_dev, v_dev = pk.to_device(q[None]), pk.to_device(k), pk.to_device(v)
    kn_dev, vn_dev = pk.to_device(k_new), pk.to_device(v_new)
    pos = pk.to_device(np.array([0], np.int32))
    out = pk.full((1, n_head, head_dim), np.nan, np.float32)
    config = dataclasses.replace(default_config(group, head_dim, dtype=dtype),
                                 early_trigger=True)
    if mode.startswith("bulk"):                      # decode_bulk: every stage before the wait
        config = bulk_config(group, head_dim)
    splits = config_splits(config, n_head, n_kv_head, max_len)
    workspace = DecodeWorkspace.allocate(1, n_head, head_dim, splits,
                                         fused=mode.endswith("one_launch"))
    if mode == "direct":
        config, splits, workspace = direct_config(config), 1, None
    stream = pk.Stream()

    def step():
        write_new_row[n_kv_head, 128, stream](kn_dev, vn_dev, k_dev, v_dev, pos, max_len,
                                              head_dim, dtype)
        launch_decode(q_dev, k_dev, v_dev, KeyRange(pos, add=1), out, scale,
                      workspace=workspace, config=config, stream=stream, early_kv=True)
    step()
    with pk.capture_graph(stream, pdl=True) as graph:
        step()
    for position in (int(rng.integers(2000, max_len)), int(rng.integers(100, 2000)), 5):
        k_dev.copy_from(k)        # the row at `position` holds the old key until the write
        v_dev.copy_from(v)
        pos.copy_from(np.array([position], np.int32))
        graph.replay(stream)
        stream.synchronize()
        k_ref, v_ref = k.copy(), v.copy()
        k_ref[:, position], v_ref[:, position] = k_new, v_new
        _check(out.numpy()[0], decode_reference(q, k_ref, v_ref, position + 1, scale), dtype,
               seed, f"PDL graph, new row at {position}, {splits} splits, {mode}")


def test_batch_splits_plan_for_the_whole_batch(monkeypatch):
    """The batch planner (8B shape on an H100's 132 multiprocessors): one sequence takes the
    one-sequence plan, 16 short ones fill the GPU without splitting, a long sequence among
    short ones keeps its splits; always a power of two up to the one-sequence plan."""
    import sys
    decode_module = sys.modules["stdlib_kernels.attention.decode_plan"]
    monkeypatch.setattr(decode_module, "multiprocessors", lambda device=None: 132)
    config = mma_config(4)

    def plan(lens):
        return attention.batch_splits(lens, config, 32, 8, 128, 2)
    assert plan([4096]) == config_splits(config, 32, 8, 4096) == 16
    assert plan([512] * 16) == 1
    assert plan([512] * 4) == 4
    assert plan([32768] + [512] * 15) == 8
    assert plan([3]) == 1                   # MIN_KEYS_PER_SPLIT
    for lens in ([1], [700, 9], [100] * 40, [5000, 6000, 7000]):
        splits = plan(lens)
        assert splits & (splits - 1) == 0 and splits <= config_splits(config, 32, 8, max(lens))


def test_default_config_follows_the_kernel_options():
    """default_config's choice on a GPU (an sm_90 stand-in: only kind and arch are read):
    decode_mma for f16 caches by default, the SIMT kernel with options.decode_mma off,
    decode_bulk where options.decode_bulk asks and head_dim allows; the CPU target keeps its
    small kernel whatever the options."""
    from types import SimpleNamespace
    from stdlib_kernels.options import KernelOptions
    h200 = SimpleNamespace(kind="cuda", arch="sm_90")
    f16 = np.float16
    assert default_config(4, 128, h200, f16, KernelOptions()) == mma_config(4, 128)
    assert default_config(4, 128, h200, f16, KernelOptions(decode_mma=False)) == \
        gpu_config(4, 128, f16)
    assert default_config(4, 128, h200, f16, KernelOptions(decode_bulk=True)) == \
        bulk_config(4, 128, stages=1)
    assert default_config(4, 256, h200, f16, KernelOptions(decode_bulk=True)) == \
        mma_config(4, 256)
    cpu = SimpleNamespace(kind="cpu", arch="cpu")
    assert default_config(4, 128, cpu, f16, KernelOptions(decode_mma=False)) == \
        default_config(4, 128, cpu, f16)
