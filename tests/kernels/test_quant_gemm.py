"""Prefill GEMM on GGUF weights (f16 tensor cores) and the matmul dispatch, against float64
dequantize(W) @ x. Both operands are rounded to f16 (relative 2^-11 each) and accumulated in
f32, so |error| <= 2^-10 * sum_k |W[k]| |x[k]| (+ f32 accumulation) per output."""
import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels.quant import reference as ref
from stdlib_kernels.quant.gemm import gemm
from stdlib_kernels.quant.matmul import matmul


def make_weights(rng, type_name, rows, n):
    w = rng.standard_normal((rows, n)).astype(np.float32)
    if type_name == "F16":
        return w.astype(np.float16).view(np.uint8)
    return ref.quantize(w, type_name)


def check(y, raw, type_name, x, seed):
    W = ref.dequantize(raw, type_name, x.shape[1]).astype(np.float64)
    x64 = x.astype(np.float64)
    bound = 1.2e-3 * (np.abs(x64) @ np.abs(W).T) + 1e-30
    err = np.abs(y - x64 @ W.T)
    assert np.all(err <= bound), f"{type_name}: max err/bound {np.max(err / bound):.2f} " \
                                 f"(seed {seed})"


@pytest.mark.parametrize("type_name", ["Q4_K", "Q8_0"])
def test_gemm_partial_tiles(device, rng, seed, type_name):
    # rows and tokens not multiples of the tile (16 on the CPU target, 128 on CUDA)
    rows, n, tokens = (19, 256, 9) if device.kind == "cpu" else (130, 512, 137)
    raw = make_weights(rng, type_name, rows, n)
    x = rng.standard_normal((tokens, n)).astype(np.float32)
    check(gemm(raw, type_name, x).numpy(), raw, type_name, x, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("type_name", ["Q6_K", "Q4_0", "F16", "Q5_K", "Q2_K"])
def test_gemm_more_types_gpu(cuda_device, rng, seed, type_name):
    raw = make_weights(rng, type_name, 200, 512)
    x = rng.standard_normal((70, 512)).astype(np.float32)
    check(gemm(raw, type_name, x).numpy(), raw, type_name, x, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("type_name", ["Q4_1", "Q5_K"])
def test_gemm_short_prompt_warps_gpu(cuda_device, rng, seed, type_name):
    # the narrower tiles short prompts use (gemm.SMALL_WARPS): 32 x 32 and 64 x 64, rows and
    # tokens off the tile
    raw = make_weights(rng, type_name, 200, 512)
    for tokens in (9, 33, 70):
        x = rng.standard_normal((tokens, 512)).astype(np.float32)
        for warps in ((1, 2), (2, 2), (1, 4), None):     # None: SMALL_WARPS' choice
            check(gemm(raw, type_name, x, warps).numpy(), raw, type_name, x, seed)


def test_gemm_into_columns_with_residual(device, rng, seed):
    # the f16 GEMM writing columns col0.. of a wider output plus a residual (gemm.output_args)
    from stdlib_kernels.quant.gemm import gemm_into
    from stdlib_kernels.quant.gemv import weight_words
    rows, n, tokens, ldy, col0 = 19, 64, 9, 30, 7
    raw = make_weights(rng, "Q4_1", rows, n)
    x = rng.standard_normal((tokens, n)).astype(np.float32)
    res = rng.standard_normal((tokens, ldy)).astype(np.float32)
    y = pk.full((tokens, ldy), np.nan, np.float32)
    gemm_into(weight_words(pk.to_device(raw), "Q4_1", n)[0], "Q4_1", pk.to_device(x), y, rows,
              n, tokens, ldy=ldy, col0=col0, res=pk.to_device(res))
    got = y.numpy()
    np.testing.assert_allclose(got[:, col0:col0 + rows],
                               gemm(raw, "Q4_1", x).numpy() + res[:, col0:col0 + rows],
                               rtol=1e-6, atol=1e-5, err_msg=f"seed {seed}")
    assert np.isnan(got[:, :col0]).all() and np.isnan(got[:, col0 + rows:]).all()


def test_matmul_dispatch(device, rng, seed):
    # Q2_K has no int8 GEMM: 9 tokens take the f16 GEMM (int8 dispatch: test_quant_gemm_q8.py)
    raw = make_weights(rng, "Q2_K", 3, 256)
    x = rng.standard_normal((9, 256)).astype(np.float32)
    check(matmul(raw, "Q2_K", x).numpy(), raw, "Q2_K", x, seed)
    y1 = matmul(raw, "Q2_K", x[0]).numpy()                  # one token: the DP4A GEMV
    W = ref.dequantize(raw, "Q2_K", 256).astype(np.float64)
    assert y1.shape == (3,)
    assert np.allclose(y1, W @ x[0], rtol=0.05, atol=0.05 * np.abs(W).sum(1).max()), seed


def test_gemm_rejects_bad_input(device, rng):
    raw = make_weights(rng, "Q8_0", 2, 64)
    with pytest.raises(ValueError, match="float32 \\(tokens, K\\)"):
        gemm(raw, "Q8_0", np.zeros(64, np.float32))
    with pytest.raises(ValueError, match="rows, 68"):
        gemm(raw[:, :34], "Q8_0", np.zeros((2, 64), np.float32))
