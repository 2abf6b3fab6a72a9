"""Tensor-core GEMV for a few tokens (stdlib_kernels.quant.gemv_mma), Q4_K and Q6_K, against the
float64 model of the int8 GEMM's tests (same arithmetic: Q8_1 activations, Q4_K's min term
through their stored block sums), on the CPU target and on CUDA; outputs poisoned before each
launch. Q6_K's super-blocks start 0 or 2 bytes past a word: rows of an odd count of them
alternate, so the cases mix odd and even K / 256."""
from types import SimpleNamespace

import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels.quant.gemv import weight_words
from stdlib_kernels.quant.gemv_mma import (KERNELS, MAX_TOKENS, default_launch, gemv_mma_into,
                                           mma_gemv_applies)
from stdlib_kernels.quant.q8_1 import quantize_q8_1
from tests.kernels.test_quant_gemm_q8 import check, make_weights

TYPES = ["Q4_K", "Q6_K"]
MMA_ARCHS = [a for a in pk.SUPPORTED_ARCHS if int(a[3:]) >= 80]


def launch(raw, type_name, x, rows, n, tokens, **options):
    w, _ = weight_words(pk.to_device(raw), type_name, n)
    xq = quantize_q8_1(pk.to_device(x))
    y = options.pop("y", None)
    if y is None:
        y = pk.full((tokens, rows), np.nan, np.float32)
    gemv_mma_into(w, type_name, xq, y, rows, n, tokens, **options)
    return y.numpy()


# (rows, K, tokens, warps, unroll, m16 tiles per warp): rows off the block's rows, 1 token
# and 9 (a second n8 tile of one column) up to 16, K split unevenly over the warps, unroll
# past a warp's share; K / 256 = 2, 1, 3, 4, 5, 2
CASES = [(37, 512, 11, 2, 1, 3), (16, 256, 1, 1, 1, 1), (20, 768, 16, 3, 2, 1),
         (5, 1024, 3, 4, 1, 2), (33, 1280, 9, 8, 1, 1), (48, 512, 2, 1, 4, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("rows,n,tokens,warps,unroll,tiles", CASES)
def test_gemv_mma(device, rng, seed, type_name, rows, n, tokens, warps, unroll, tiles):
    raw = make_weights(rng, type_name, rows, n)
    x = rng.standard_normal((tokens, n)).astype(np.float32)
    check(launch(raw, type_name, x, rows, n, tokens, warps=warps, unroll=unroll, tiles=tiles),
          raw, type_name, x, seed)


@pytest.mark.parametrize("type_name", TYPES)
def test_gemv_mma_output_columns_and_residual(device, rng, seed, type_name):
    # C into columns col0.. of a wider output, plus a residual at the same place that is the
    # output itself (as the runner's residual adds run in place)
    rows, n, tokens, ldy, col0 = 21, 512, 6, 40, 13
    raw = make_weights(rng, type_name, rows, n)
    x = rng.standard_normal((tokens, n)).astype(np.float32)
    alone = launch(raw, type_name, x, rows, n, tokens)
    check(alone, raw, type_name, x, seed)
    res = rng.standard_normal((tokens, ldy)).astype(np.float32)
    y = pk.to_device(res)
    got = launch(raw, type_name, x, rows, n, tokens, y=y, ldy=ldy, col0=col0, res=y)
    np.testing.assert_allclose(got[:, col0:col0 + rows], alone + res[:, col0:col0 + rows],
                               rtol=1e-5, atol=1e-5, err_msg=f"seed {seed}")
    np.testing.assert_array_equal(got[:, :col0], res[:, :col0])
    np.testing.assert_array_equal(got[:, col0 + rows:], res[:, col0 + rows:])


def test_gemv_mma_rejects_what_it_cannot_run():
    pk.set_device("cpu")
    raw = np.zeros((4, 144), np.uint8)
    w, _ = weight_words(pk.to_device(raw), "Q4_K", 256)
    xq = pk.zeros((2, 288), np.uint8)
    y = pk.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match="no tensor-core GEMV for Q5_K"):
        gemv_mma_into(w, "Q5_K", xq, y, 4, 256, 2)
    with pytest.raises(ValueError, match=f"17 tokens, expected 1..{MAX_TOKENS}"):
        gemv_mma_into(w, "Q4_K", pk.zeros((17, 288), np.uint8), pk.zeros((17, 4), np.float32),
                      4, 256, 17)
    with pytest.raises(ValueError, match="multiple of 256"):
        gemv_mma_into(w, "Q4_K", xq, y, 4, 128, 2)
    with pytest.raises(ValueError, match="2 x 288 bytes"):
        gemv_mma_into(w, "Q4_K", pk.zeros((2, 144), np.uint8), y, 4, 256, 2)
    with pytest.raises(ValueError, match="4 rows x 144 bytes"):
        gemv_mma_into(w[:-1], "Q4_K", xq, y, 4, 256, 2)
    with pytest.raises(ValueError, match="Q6_K: weights must be uint16 words of 4 rows x 210"):
        gemv_mma_into(w, "Q6_K", xq, y, 4, 256, 2)             # Q4_K's u32 words
    with pytest.raises(ValueError, match=r"warps 33 \(1..32\)"):
        gemv_mma_into(w, "Q4_K", xq, y, 4, 256, 2, warps=33)


@pytest.mark.parametrize("arch", MMA_ARCHS)
@pytest.mark.parametrize("type_name", TYPES)
def test_gemv_mma_ptx_assembles(arch, type_name, assemble):
    # the GPU's default shape up to 8 tokens (one m16 tile, 2 super-blocks ahead), two n8
    # tiles: per super-block, row tile and n8 tile 8 k32 mma for Q4_K, 16 k16 for Q6_K (one
    # per 16-value scale group)
    spec = dict(MI=1, NT=2, WARPS=8, UNROLL=2, HAS_RES=True)
    ptx = KERNELS[type_name].ptx(arch, **spec)
    k, per_block = (32, 8) if type_name == "Q4_K" else (16, 16)
    assert ptx.count(f"mma.sync.aligned.m16n8k{k}.row.col.s32.s8.s8.s32") == per_block * 2 * 2
    assemble(ptx, arch)


def test_gemv_mma_default_launch_and_routing():
    # both types are routed here at MIN_TOKENS..MAX_TOKENS; Q6_K's wide two-tile launch loads
    # one super-block ahead (17 words per row and super-block), Q4_K's two
    gpu = SimpleNamespace(kind="cuda")
    assert default_launch(28672, 8, gpu, "Q4_K") == (4, 2, 2)
    assert default_launch(28672, 8, gpu, "Q6_K") == (4, 1, 2)
    for type_name in TYPES:
        assert default_launch(4096, 8, gpu, type_name) == (8, 2, 1)
        assert default_launch(4096, 16, gpu, type_name) == (8, 1, 2)
    assert mma_gemv_applies("Q4_K", 8) and mma_gemv_applies("Q6_K", 8)
    assert not mma_gemv_applies("Q5_K", 8) and not mma_gemv_applies("Q6_K", 4)
