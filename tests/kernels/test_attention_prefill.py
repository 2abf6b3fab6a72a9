"""Prefill attention (stdlib_kernels.attention) against the float64 numpy reference: the SIMT
path (any arch, f32 or f16 cache) on the CPU target and CUDA, the tensor-core path (mma
emulated exactly on the CPU target; the smallest tile there, since its compile is slow) and,
on the GPU, every head_dim and GQA ratio with window and softcap on and off."""
import numpy as np
import pytest
from attention_checks import check_close, prefill_expected, prefill_problem

import pykernel as pk
from stdlib_kernels import attention
from stdlib_kernels.attention.prefill import launch_prefill
from stdlib_kernels.attention.reference import attention_reference


def _run(q, k, v, start, scale, window, softcap, path, **kw):
    out = pk.full(q.shape, np.nan, np.float32)
    launch_prefill(pk.to_device(q), pk.to_device(k), pk.to_device(v), out, start, scale,
                   window=window, softcap=softcap, path=path, **kw)
    return out.numpy()


# (tokens, start, n_head, n_kv_head, head_dim, dtype, window, softcap)
SIMT_CASES = [
    (7, 0, 4, 4, 64, np.float32, None, None),
    (5, 11, 6, 2, 80, np.float16, 6, None),
    (6, 3, 4, 1, 96, np.float32, None, 10.0),
    (4, 9, 8, 1, 128, np.float16, 5, 30.0),
    (3, 2, 8, 2, 256, np.float32, None, None),
]


@pytest.mark.parametrize("case", SIMT_CASES, ids=lambda c: f"t{c[0]}d{c[4]}")
def test_prefill_simt_matches_reference(device, rng, seed, case):
    tokens, start, n_head, n_kv_head, head_dim, dtype, window, softcap = case
    q, k, v = prefill_problem(rng, tokens, start, n_head, n_kv_head, head_dim, dtype)
    scale = head_dim ** -0.5
    got = _run(q, k, v, start, scale, window, softcap, "simt")
    check_close(got, prefill_expected(q, k, v, start, scale, window, softcap), dtype, seed,
                str(case))


@pytest.mark.parametrize("window,softcap", [(None, None), (5, 8.0)])
def test_prefill_mma_matches_reference(device, rng, seed, window, softcap):
    """Tensor-core paths; 19 rows per head group straddle the 16-row tiles, 27 keys the 16-key
    tile. On the CPU target the mma is emulated bit-exactly (one warp, 16-key tiles)."""
    tokens, start = 19, 8
    q, k, v = prefill_problem(rng, tokens, start, 2, 1, 64, np.float16)
    kw = dict(warps=1, block_keys=16) if device.kind == "cpu" else {}
    got = _run(q, k, v, start, 0.125, window, softcap, "mma", **kw)
    check_close(got, prefill_expected(q, k, v, start, 0.125, window, softcap), np.float16,
                seed, "mma")


@pytest.mark.slow
@pytest.mark.parametrize("warps,stages,m_tiles,window", [(2, 2, 1, None), (1, 3, 2, 7)])
def test_prefill_mma_tilings(device, rng, seed, warps, stages, m_tiles, window):
    """32-key tiles at head_dim 80 (5 ldmatrix k-steps, a ragged share of each tile's copies
    per thread): 21 tokens after 40 cached positions run several row blocks over 2 tiles
    each, so the ring wraps and both the unmasked and the masked tile branches run; two
    m-tiles per warp and a window too."""
    q, k, v = prefill_problem(rng, 21, 40, 4, 2, 80, np.float16)
    got = _run(q, k, v, 40, 80 ** -0.5, window, None, "mma", warps=warps, block_keys=32,
               stages=stages, m_tiles=m_tiles)
    check_close(got, prefill_expected(q, k, v, 40, 80 ** -0.5, window), np.float16, seed,
                f"{warps} warps S{stages} MT{m_tiles} window {window}")


def test_prefill_mma_reads_q_in_place(device, rng, seed):
    """q as the first n_head * head_dim columns of a wider (tokens, W) array (the runner's
    fused q|k|v output, read in place): the same result as the (tokens, n_head, D) array."""
    tokens, start = 19, 8
    q, k, v = prefill_problem(rng, tokens, start, 2, 1, 64, np.float16)
    wide = rng.standard_normal((tokens, 2 * 64 + 37)).astype(np.float32)
    wide[:, :128] = q.reshape(tokens, 128)
    kw = dict(warps=1, block_keys=16) if device.kind == "cpu" else {}
    kd, vd = pk.to_device(k), pk.to_device(v)
    out = pk.full(q.shape, np.nan, np.float32)
    launch_prefill(pk.to_device(wide), kd, vd, out, start, 0.125, path="mma", n_head=2, **kw)
    np.testing.assert_array_equal(out.numpy(), _run(q, k, v, start, 0.125, None, None, "mma",
                                                    **kw))
    with pytest.raises(ValueError, match="3 heads of 64 do not fit q rows of 165"):
        launch_prefill(pk.to_device(wide), kd, vd, out, start, 0.125, path="mma", n_head=3)
    with pytest.raises(ValueError, match="simt path takes q as"):
        launch_prefill(pk.to_device(wide), kd, vd, out, start, 0.125, path="simt", n_head=2)


@pytest.mark.parametrize("path", ["mma", "simt"])
def test_prefill_start_on_the_device(device, rng, seed, path):
    """start_dev (the runner's prefill graphs): the kernels add a device int32 to `start`,
    so one launch configuration serves new positions; the same result as a host start."""
    tokens, start = 19, 8
    q, k, v = prefill_problem(rng, tokens, start, 2, 1, 64, np.float16)
    kw = dict(warps=1, block_keys=16) if device.kind == "cpu" and path == "mma" else {}
    for host, on_device in ((0, start), (3, start - 3)):
        out = pk.full(q.shape, np.nan, np.float32)
        launch_prefill(pk.to_device(q), pk.to_device(k), pk.to_device(v), out, host, 0.125,
                       path=path, start_dev=pk.to_device(np.array([on_device], np.int32)), **kw)
        np.testing.assert_array_equal(out.numpy(), _run(q, k, v, start, 0.125, None, None,
                                                        path, **kw))
    with pytest.raises(ValueError, match="start_dev must be a device int32"):
        launch_prefill(pk.to_device(q), pk.to_device(k), pk.to_device(v), out, 0, 0.125,
                       path=path, start_dev=pk.to_device(np.array([1.0], np.float32)))


@pytest.mark.parametrize("window", [None, 6])
def test_prefill_seqs_equal_each_sequence_alone(device, rng, seed, window):
    """launch_prefill_seqs: four sequences of 19, 1, 7 and 33 tokens (after 8, 20, 0 and 3
    cached positions) in one launch over a pool of five cache slots, their q rows in one
    (tokens, W) array read in place; each sequence's out rows against launch_prefill on its
    own slot and rows (the same tiles: bit-equal), rows of no sequence left untouched."""
    from stdlib_kernels.attention.prefill import launch_prefill_seqs
    counts, starts, slots = [19, 1, 7, 33], [8, 20, 0, 3], [3, 0, 4, 1]
    n_head, n_kv_head, d, max_len = 4, 2, 64, 40
    first = np.concatenate([[2], 2 + np.cumsum(counts)[:-1]])     # two rows of no sequence
    tokens = int(first[-1] + counts[-1] + 1)
    wide = rng.standard_normal((tokens, n_head * d + 24)).astype(np.float32)
    k = rng.standard_normal((5, n_kv_head, max_len, d)).astype(np.float16)
    v = rng.standard_normal((5, n_kv_head, max_len, d)).astype(np.float16)
    kw = dict(warps=1, block_keys=16) if device.kind == "cpu" else {}
    qd, kd, vd = pk.to_device(wide), pk.to_device(k), pk.to_device(v)
    seqs = np.stack([first, counts, starts, slots], axis=1).astype(np.int32)
    out = pk.full((tokens, n_head, d), np.nan, np.float32)
    launch_prefill_seqs(qd, kd, vd, out, seqs, 0.125, window=window, n_head=n_head, **kw)
    got = out.numpy()
    for f, n, start, slot in seqs:
        alone = pk.full((n, n_head, d), np.nan, np.float32)
        launch_prefill(qd[f:f + n], kd[slot], vd[slot], alone, int(start), 0.125,
                       window=window, path="mma", n_head=n_head, **kw)
        np.testing.assert_array_equal(got[f:f + n], alone.numpy(), err_msg=f"seed {seed}")
        q = wide[f:f + n, :n_head * d].reshape(n, n_head, d)
        check_close(got[f:f + n], prefill_expected(q, k[slot], v[slot], start, 0.125, window),
                    np.float16, seed, f"sequence at row {f}")
    untouched = np.ones(tokens, bool)
    for f, n, _, _ in seqs:
        untouched[f:f + n] = False
    assert np.isnan(got[untouched]).all()
    with pytest.raises(ValueError, match=r"sequence 1 \[21, 1, 40, 0\]"):
        bad = seqs.copy()
        bad[1, 2] = 40                                 # positions past max_len
        launch_prefill_seqs(qd, kd, vd, out, bad, 0.125, n_head=n_head, **kw)
    with pytest.raises(ValueError, match="must both be f16"):
        launch_prefill_seqs(qd, kd[0], vd[0], out, seqs, 0.125, n_head=n_head)


def test_prefill_contract_api(device, rng, seed):
    tokens, kv_tokens = 5, 12
    q = rng.standard_normal((tokens, 4, 64)).astype(np.float32)
    k = rng.standard_normal((kv_tokens, 2, 64)).astype(np.float32)
    v = rng.standard_normal((kv_tokens, 2, 64)).astype(np.float32)
    got = attention.prefill(q, k, v, 0.125, path="simt")
    assert got.shape == (tokens, 4, 64)
    check_close(got, attention_reference(q, k, v, 0.125), np.float32, seed, "prefill()")


def test_prefill_rejects_bad_input(device):
    q = pk.zeros((4, 4, 64), np.float32)
    cache = pk.zeros((2, 8, 64), np.float16)
    with pytest.raises(ValueError, match="do not fit a cache of max_len 8"):
        launch_prefill(q, cache, cache, pk.zeros((4, 4, 64)), 5, 1.0)
    with pytest.raises(ValueError, match="f16 cache"):
        launch_prefill(q, pk.zeros((2, 8, 64)), pk.zeros((2, 8, 64)), pk.zeros((4, 4, 64)), 0,
                       1.0, path="mma")
    with pytest.raises(ValueError, match="block_keys 24 must be a multiple of 16"):
        launch_prefill(q, cache, cache, pk.zeros((4, 4, 64)), 0, 1.0, path="mma",
                       block_keys=24)
    with pytest.raises(ValueError, match="m_tiles 1 or 2 \\(got 3\\)"):
        launch_prefill(q, cache, cache, pk.zeros((4, 4, 64)), 0, 1.0, path="mma", m_tiles=3)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("n_head,n_kv_head", [(8, 8), (12, 4), (16, 2), (4, 1)])
def test_gpu_prefill_mma_all_shapes(rng, seed, head_dim, n_head, n_kv_head):
    pk.set_device("cuda")
    for tokens, start, window, softcap in ((77, 0, None, None), (130, 301, 64, 50.0)):
        q, k, v = prefill_problem(rng, tokens, start, n_head, n_kv_head, head_dim, np.float16)
        scale = head_dim ** -0.5
        got = _run(q, k, v, start, scale, window, softcap, "mma")
        check_close(got, prefill_expected(q, k, v, start, scale, window, softcap), np.float16,
                    seed, f"tokens {tokens} start {start} window {window} softcap {softcap}")


@pytest.mark.gpu
@pytest.mark.parametrize("block_keys,warps,stages,m_tiles", [
    (32, 4, 2, 1), (64, 4, 3, 1), (32, 8, 4, 1), (16, 4, 3, 2), (16, 8, 4, 2), (32, 2, 2, 2)])
def test_gpu_prefill_mma_tilings(rng, seed, block_keys, warps, stages, m_tiles):
    pk.set_device("cuda")
    q, k, v = prefill_problem(rng, 300, 517, 32, 8, 128, np.float16)
    got = _run(q, k, v, 517, 128 ** -0.5, None, None, "mma", block_keys=block_keys,
               warps=warps, stages=stages, m_tiles=m_tiles)
    check_close(got, prefill_expected(q, k, v, 517, 128 ** -0.5), np.float16, seed,
                f"BN={block_keys} {warps} warps S{stages} MT{m_tiles}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_gpu_prefill_long_simt_and_mma(rng, seed, dtype):
    pk.set_device("cuda")
    q, k, v = prefill_problem(rng, 512, 1500, 8, 2, 128, dtype)
    expected = prefill_expected(q, k, v, 1500, 128 ** -0.5)
    for path in ("simt", "mma") if dtype == np.float16 else ("simt",):
        got = _run(q, k, v, 1500, 128 ** -0.5, None, None, path)
        check_close(got, expected, dtype, seed, f"512 tokens after 1500, {path}")


@pytest.mark.parametrize("arch", [a for a in pk.SUPPORTED_ARCHS if int(a[3:]) >= 80])
@pytest.mark.parametrize("varlen", [False, True])
def test_prefill_flash_ptx_assembles(arch, varlen, assemble):
    """The tensor-core prefill, one sequence or a table of them (VARLEN), at the runner's
    tiling for head_dim 128: PTX that ptxas accepts for every mma-capable arch."""
    from stdlib_kernels.attention.prefill_flash import prefill_flash
    ptx = prefill_flash.ptx(arch, D=128, BN=64, NWARPS=4, STAGES=3, MT=1, VARLEN=varlen,
                            SINK=False)
    assert ("%ctaid.z" in ptx) == varlen
    assemble(ptx, arch)
