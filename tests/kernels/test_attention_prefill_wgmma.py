"""Prefill attention on wgmma (stdlib_kernels.attention.prefill_wgmma) against the float64 numpy
reference and against today's tensor-core prefill (the mma path), on the CPU target (which
emulates wgmma, TMA and the mbarriers; small shapes, its emulation is slow) and the GPU.

Every case poisons the cache rows past the prompt with NaN (the kernel must not read them: a
masked key's zero weight times NaN would spread) and the output with NaN (an unwritten row
fails). Bound against the mma path: both round Q, K, V and every P = exp2(s - m) to f16 (unit
roundoff u = 2^-11) and accumulate in f32, with the same unrounded f32 denominators, so one
output element moves by at most u * sum_i p_i |v_i| / l <= u max|V| per kernel: 2u max|V|
between them (the f32 sums' own rounding, ~keys x 2^-24, is far below; 2.5 u leaves it room)."""
import numpy as np
import pytest
from attention_checks import check_close, prefill_expected, prefill_problem

import pykernel as pk
from stdlib_kernels.attention.prefill import launch_prefill
from stdlib_kernels.attention.prefill_wgmma import launch_prefill_wgmma

F16_UNIT_ROUNDOFF = 2.0 ** -11


def _problem(rng, tokens, start, n_head, n_kv_head, head_dim, spare=40):
    q, k, v = prefill_problem(rng, tokens, start, n_head, n_kv_head, head_dim, np.float16,
                              spare=spare)
    k[:, start + tokens:] = np.nan        # rows past the prompt: never read
    v[:, start + tokens:] = np.nan
    return q, k, v


def _run(q, k, v, start, scale, window=None, softcap=None, sinks=None, path="wgmma", **kw):
    out = pk.full(q.shape, np.nan, np.float32)
    sinks_dev = None if sinks is None else pk.to_device(sinks)
    args = (pk.to_device(q), pk.to_device(k), pk.to_device(v), out, start, scale)
    if path == "wgmma":
        launch_prefill_wgmma(*args, window=window, softcap=softcap, sinks=sinks_dev, **kw)
    else:
        launch_prefill(*args, window=window, softcap=softcap, sinks=sinks_dev, path=path,
                       **kw)
    return out.numpy()


def _check_against_mma(got, mma, v, seed, what):
    bound = 2.5 * F16_UNIT_ROUNDOFF * float(np.nanmax(np.abs(v.astype(np.float32))))
    diff = float(np.abs(got.astype(np.float64) - mma).max())
    assert diff <= bound, f"{what}: max |wgmma - mma| {diff:.3g} > {bound:.3g} (seed {seed})"


# (tokens, start, n_head, n_kv_head, head_dim, block_keys, stages, window, softcap, sinks):
# query rows (tokens x group) that are not multiples of the 128-row block, past lengths that
# are not multiples of the tile, GQA groups 1 / 4 / 8, a context shorter than one tile (its
# last tile starts at a negative key: TMA's zero fill), rings that wrap
CPU_CASES = [
    (37, 45, 4, 1, 64, 32, 2, None, None, False),
    (5, 3, 4, 4, 64, 64, 2, None, None, False),
    (23, 70, 16, 2, 64, 16, 3, 19, None, True),
    (21, 100, 2, 2, 128, 32, 2, None, 30.0, False),
]


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: f"t{c[0]}s{c[1]}g{c[2] // c[3]}"
                         f"d{c[4]}")
def test_prefill_wgmma_matches_reference_and_mma(device, rng, seed, case):
    tokens, start, n_head, n_kv_head, head_dim, bn, stages, window, softcap, sink = case
    if device.kind == "cuda" and pk.current_device().arch != "sm_90":
        pytest.skip("wgmma needs an sm_90 GPU")
    q, k, v = _problem(rng, tokens, start, n_head, n_kv_head, head_dim)
    sinks = rng.standard_normal(n_head).astype(np.float32) if sink else None
    scale = head_dim ** -0.5
    got = _run(q, k, v, start, scale, window, softcap, sinks, block_keys=bn, stages=stages)
    check_close(got, prefill_expected(q, k, v, start, scale, window, softcap, sinks),
                np.float16, seed, str(case))
    mma_kw = {"warps": 1, "block_keys": 16} if device.kind == "cpu" else {}
    mma = _run(q, k, v, start, scale, window, softcap, sinks, path="mma", **mma_kw)
    _check_against_mma(got, mma, v, seed, str(case))


def test_prefill_wgmma_q_in_place_and_start_on_device(device, rng, seed):
    """q as the first n_head * D columns of a wider (tokens, W) array (the fused q|k|v rows)
    and the start split into a host part and a device part (a prefill graph's), through
    launch_prefill(path="wgmma"): the same result as the plain launch."""
    if device.kind == "cuda" and pk.current_device().arch != "sm_90":
        pytest.skip("wgmma needs an sm_90 GPU")
    tokens, start, n_head = 19, 33, 4
    q, k, v = _problem(rng, tokens, start, n_head, 2, 64)
    wide = np.full((tokens, n_head * 64 + 96), np.nan, np.float32)
    wide[:, :n_head * 64] = q.reshape(tokens, -1)
    out = pk.full(q.shape, np.nan, np.float32)
    launch_prefill(pk.to_device(wide), pk.to_device(k), pk.to_device(v), out, 30, 0.125,
                   path="wgmma", n_head=n_head, start_dev=pk.to_device(np.int32([3])),
                   block_keys=32, stages=2)
    plain = _run(q, k, v, start, 0.125, block_keys=32, stages=2)
    np.testing.assert_array_equal(out.numpy(), plain, err_msg=f"seed {seed}")
    check_close(plain, prefill_expected(q, k, v, start, 0.125), np.float16, seed, "in place")


def test_prefill_wgmma_rejects_bad_input():
    q = pk.zeros((4, 4, 64), np.float32)
    cache = pk.zeros((2, 8, 64), np.float16)
    out = pk.zeros((4, 4, 64), np.float32)
    with pytest.raises(ValueError, match="must both be f16"):
        launch_prefill_wgmma(q, pk.zeros((2, 8, 64)), pk.zeros((2, 8, 64)), out, 0, 1.0)
    with pytest.raises(ValueError, match="head_dim must be one of \\(64, 128\\)"):
        launch_prefill_wgmma(pk.zeros((4, 4, 80), np.float32), pk.zeros((2, 8, 80), np.float16),
                             pk.zeros((2, 8, 80), np.float16), pk.zeros((4, 4, 80)), 0, 1.0)
    with pytest.raises(ValueError, match="do not fit a cache of max_len 8"):
        launch_prefill_wgmma(q, cache, cache, out, 5, 1.0)
    with pytest.raises(ValueError, match="block_keys 24 must be a multiple of 16"):
        launch_prefill_wgmma(q, cache, cache, out, 0, 1.0, block_keys=24)
    with pytest.raises(ValueError, match="must fit 232448 bytes"):
        launch_prefill_wgmma(q, cache, cache, out, 0, 1.0, block_keys=256, stages=4)
    with pytest.raises(ValueError, match="out must be"):
        launch_prefill_wgmma(q, cache, cache, pk.zeros((4, 4, 32)), 0, 1.0)


@pytest.mark.parametrize("head_dim,block_keys,stages,sink", [(128, 128, 2, False),
                                                              (64, 128, 4, True)])
def test_prefill_wgmma_ptx_assembles(head_dim, block_keys, stages, sink, assemble):
    """The default tilings: TMA tensor loads, register-A wgmma (S) and N-major B (P V),
    setmaxnreg, for sm_90a."""
    from stdlib_kernels.attention.prefill_wgmma_kernel import prefill_wgmma
    ptx = prefill_wgmma.ptx("sm_90a", D=head_dim, BN=block_keys, STAGES=stages, SINK=sink)
    assert ".target sm_90a" in ptx and "cp.async.bulk.tensor.3d" in ptx
    assert f"wgmma.mma_async.sync.aligned.m64n{block_keys}k16.f32.f16.f16" in ptx
    assert f"wgmma.mma_async.sync.aligned.m64n{head_dim}k16.f32.f16.f16" in ptx
    assert "setmaxnreg.inc.sync.aligned.u32 232" in ptx
    assemble(ptx, "sm_90a")


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,start", [(512, 0), (512, 4096), (300, 517), (77, 1000)])
@pytest.mark.parametrize("head_dim,n_head,n_kv_head", [(128, 32, 8), (64, 8, 8), (64, 16, 2)])
def test_gpu_prefill_wgmma_shapes(rng, seed, tokens, start, head_dim, n_head, n_kv_head):
    pk.set_device("cuda")
    if pk.current_device().arch != "sm_90":
        pytest.skip("wgmma needs an sm_90 GPU")
    q, k, v = _problem(rng, tokens, start, n_head, n_kv_head, head_dim)
    scale = head_dim ** -0.5
    for window, softcap in ((None, None), (200, 50.0)):
        got = _run(q, k, v, start, scale, window, softcap)
        what = f"{tokens} tokens after {start}, window {window} softcap {softcap}"
        check_close(got, prefill_expected(q, k, v, start, scale, window, softcap), np.float16,
                    seed, what)
        _check_against_mma(got, _run(q, k, v, start, scale, window, softcap, path="mma"), v,
                           seed, what)
