"""Tensor-core GEMV for a few tokens (stdlib_kernels.quant.gemv_mma) against the float64 model
of the int8 GEMM's tests (same arithmetic: Q8_1 activations, the min term through their
stored block sums), on the CPU target and on CUDA; outputs poisoned before each launch."""
import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels.quant.gemv import weight_words
from stdlib_kernels.quant.gemv_mma import MAX_TOKENS, gemv_mma_into
from stdlib_kernels.quant.q8_1 import quantize_q8_1
from tests.kernels.test_quant_gemm_q8 import check, make_weights


def launch(raw, x, rows, n, tokens, **options):
    w, _ = weight_words(pk.to_device(raw), "Q4_K", n)
    xq = quantize_q8_1(pk.to_device(x))
    y = options.pop("y", None)
    if y is None:
        y = pk.full((tokens, rows), np.nan, np.float32)
    gemv_mma_into(w, "Q4_K", xq, y, rows, n, tokens, **options)
    return y.numpy()


# (rows, K, tokens, warps, unroll, m16 tiles per warp): rows off the block's rows, 1 token
# and 9 (a second n8 tile of one column) up to 16, K split unevenly over the warps, unroll
# past a warp's share
CASES = [(37, 512, 11, 2, 1, 3), (16, 256, 1, 1, 1, 1), (20, 768, 16, 3, 2, 1),
         (5, 1024, 3, 4, 1, 2), (33, 1280, 9, 8, 1, 1), (48, 512, 2, 1, 4, 1)]


@pytest.mark.parametrize("rows,n,tokens,warps,unroll,tiles", CASES)
def test_gemv_mma_q4_k(device, rng, seed, rows, n, tokens, warps, unroll, tiles):
    raw = make_weights(rng, "Q4_K", rows, n)
    x = rng.standard_normal((tokens, n)).astype(np.float32)
    check(launch(raw, x, rows, n, tokens, warps=warps, unroll=unroll, tiles=tiles), raw,
          "Q4_K", x, seed)


def test_gemv_mma_output_columns_and_residual(device, rng, seed):
    # C into columns col0.. of a wider output, plus a residual at the same place that is the
    # output itself (as the runner's residual adds run in place)
    rows, n, tokens, ldy, col0 = 21, 512, 6, 40, 13
    raw = make_weights(rng, "Q4_K", rows, n)
    x = rng.standard_normal((tokens, n)).astype(np.float32)
    alone = launch(raw, x, rows, n, tokens)
    res = rng.standard_normal((tokens, ldy)).astype(np.float32)
    y = pk.to_device(res)
    got = launch(raw, x, rows, n, tokens, y=y, ldy=ldy, col0=col0, res=y)
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
    with pytest.raises(ValueError, match="no tensor-core GEMV for Q6_K"):
        gemv_mma_into(w, "Q6_K", xq, y, 4, 256, 2)
    with pytest.raises(ValueError, match=f"17 tokens, expected 1..{MAX_TOKENS}"):
        gemv_mma_into(w, "Q4_K", pk.zeros((17, 288), np.uint8), pk.zeros((17, 4), np.float32),
                      4, 256, 17)
    with pytest.raises(ValueError, match="multiple of 256"):
        gemv_mma_into(w, "Q4_K", xq, y, 4, 128, 2)
    with pytest.raises(ValueError, match="2 x 288 bytes"):
        gemv_mma_into(w, "Q4_K", pk.zeros((2, 144), np.uint8), y, 4, 256, 2)
    with pytest.raises(ValueError, match="4 rows x 144 bytes"):
        gemv_mma_into(w[:-1], "Q4_K", xq, y, 4, 256, 2)
    with pytest.raises(ValueError, match=r"warps 33 \(1..32\)"):
        gemv_mma_into(w, "Q4_K", xq, y, 4, 256, 2, warps=33)
