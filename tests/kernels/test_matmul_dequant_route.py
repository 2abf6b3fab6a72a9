"""quant.matmul's dequant-to-f16 route (KernelOptions.dequant_f16_gemm): on the CPU target
(which emulates sm_90a) a Q8_0 / Q4_K / Q6_K matmul_into of at least dequant_f16_tokens tokens
dequantizes the weights into the f16 buffer and runs gemm_hopper, agreeing with the default
route (int8 kernels on Q8_1 activations) within the bound that f16 weights and activations imply
against Q8_1 activations (test_matmul_hopper_route._bound: the same numerics as gemm_hopper_quant);
the chunked path (a buffer smaller than W) with a column offset and residual is bit-equal to the
one-pass result; f16 activations give what converted f32 ones give; the rule's conditions."""
import dataclasses
import importlib

import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels.options import KernelOptions
from stdlib_kernels.quant.gemv import weight_words
from tests.kernels.test_matmul_hopper_route import _problem, _run, check_route
from tests.runtime.fakes import mock_cuda_device

M = importlib.import_module("stdlib_kernels.quant.matmul")   # the package shadows the module
ON = KernelOptions(dequant_f16_gemm=True, dequant_f16_tokens=16)
ROUTE_LAUNCHES = {"dequant_f16_rows", "gemm_tn"}


@pytest.mark.parametrize("type_name, rows, K", [("Q8_0", 72, 512), ("Q4_K", 40, 512),
                                                ("Q6_K", 24, 2048)])
def test_option_routes_prompts_to_dequant_f16(type_name, rows, K, rng, seed, cpu_device):
    check_route(type_name, rows, K, 17, ON, M.GEMM_DEQUANT_F16, ROUTE_LAUNCHES, rng, seed)


def test_below_the_token_threshold_keeps_the_default_launches(rng, cpu_device):
    x, raw = _problem(rng, "Q8_0", 15, 72, 512)
    default = _run(raw, "Q8_0", x, 72, KernelOptions())
    below = _run(raw, "Q8_0", x, 72, ON)
    assert default[1] == below[1] and not set(below[1]) & ROUTE_LAUNCHES, below[1]
    np.testing.assert_array_equal(default[0], below[0])


def test_chunks_with_column_offset_and_residual_bit_exact(rng, seed, device):
    """A buffer of 30 rows for 72: chunks of 30, 30, 12 into columns 20..92 of y (16, 100) plus
    res, y aliasing res: the one-pass C + res, the other columns untouched."""
    tokens, rows, K, ldy, col0 = 16, 72, 256, 100, 20
    x, raw = _problem(rng, "Q4_K", tokens, rows, K)
    words, _ = weight_words(pk.to_device(raw), "Q4_K", K)
    xd = pk.to_device(x)
    c = pk.full((tokens, rows), np.nan, np.float32)
    M.matmul_dequant_f16_into(words, "Q4_K", xd, c, rows, K, tokens,
                              pk.full((rows * K,), np.nan, np.float16))
    res = rng.standard_normal((tokens, ldy)).astype(np.float32)
    y = pk.to_device(res)
    M.matmul_dequant_f16_into(words, "Q4_K", xd, y, rows, K, tokens,
                              pk.full((30 * K + 100,), np.nan, np.float16), ldy=ldy, col0=col0,
                              res=y)
    want = res.copy()
    want[:, col0:col0 + rows] += c.numpy()
    np.testing.assert_array_equal(y.numpy(), want, err_msg=f"seed {seed}")


def test_f16_activations_equal_converted_f32(rng, seed, device):
    tokens, rows, K = 16, 24, 256
    x, raw = _problem(rng, "Q8_0", tokens, rows, K)
    words, _ = weight_words(pk.to_device(raw), "Q8_0", K)
    buf = pk.empty((rows * K,), np.float16)
    outs = []
    for xs in (x, x.astype(np.float16)):
        y = pk.full((tokens, rows), np.nan, np.float32)
        M.matmul_dequant_f16_into(words, "Q8_0", pk.to_device(xs), y, rows, K, tokens, buf)
        outs.append(y.numpy())
    np.testing.assert_array_equal(outs[0], outs[1], err_msg=f"seed {seed}")


def test_a_buffer_without_one_row_is_refused(rng, cpu_device):
    x, raw = _problem(rng, "Q8_0", 16, 8, 256)
    words, _ = weight_words(pk.to_device(raw), "Q8_0", 256)
    with pytest.raises(ValueError, match="less than one row of 256"):
        M.matmul_dequant_f16_into(words, "Q8_0", pk.to_device(x), pk.empty((16, 8), np.float32),
                                  8, 256, 16, pk.empty((255,), np.float16))


def test_rule_needs_sm_90_a_served_format_k_and_tokens(cpu_device):
    sm90, sm80 = mock_cuda_device("sm_90"), mock_cuda_device("sm_80")
    rule = M.choose_matmul_path
    assert rule("Q4_K", 16, True, ON, k=512, device=sm90) == M.GEMM_DEQUANT_F16
    assert rule("Q4_K", 16, True, ON, k=512, device=sm80) == M.GEMV_MMA
    assert rule("Q8_0", 512, True, ON, k=96, device=sm90) == M.GEMM_DEQUANT_F16   # 3 blocks
    assert rule("Q8_0", 512, True, ON, device=sm90) == M.GEMM_Q8            # no k: not taken
    assert rule("MXFP4", 512, False, ON, k=512, device=sm90) == M.GEMM_DEQUANT_F16
    assert rule("F16", 512, False, ON, k=512, device=sm90) == M.GEMM_F16     # not quantized
    assert rule("Q8_0", 15, True, ON, k=512, device=sm90) == M.GEMM_Q8       # below threshold
    assert rule("Q8_0", 4, True, ON, k=512, device=sm90) == M.GEMV           # the GEMV's
    both = dataclasses.replace(ON, hopper_quant_gemm=True)
    assert rule("Q8_0", 16, True, both, k=512, device=sm90) == M.GEMM_DEQUANT_F16
    assert rule("Q8_0", 8, True, both, k=512, device=sm90) == M.GEMM_HOPPER_Q
    # the default (None): on for CUDA GPUs (where dequant_f16_applies: sm_90), off on the CPU
    # target; False keeps the int8 route on a GPU too
    assert rule("Q8_0", 512, True, KernelOptions(), k=512, device=sm90) == M.GEMM_DEQUANT_F16
    assert rule("Q8_0", 255, True, KernelOptions(), k=512, device=sm90) == M.GEMM_Q8
    assert rule("Q8_0", 512, True, KernelOptions(), k=512, device=sm80) == M.GEMM_Q8
    assert rule("Q8_0", 512, True, KernelOptions(), k=512, device=cpu_device) == M.GEMM_Q8
    off = KernelOptions(dequant_f16_gemm=False)
    assert rule("Q8_0", 512, True, off, k=512, device=sm90) == M.GEMM_Q8


def test_env_variables_set_the_option():
    on = KernelOptions.from_env({"PYKERNEL_DEQUANT_F16_GEMM": "1",
                                 "PYKERNEL_DEQUANT_F16_TOKENS": "128"})
    assert on.dequant_f16_gemm and on.dequant_f16_tokens == 128
    default = KernelOptions.from_env({})
    assert default.dequant_f16_gemm is None and default.dequant_f16_tokens == 256
    assert KernelOptions.from_env({"PYKERNEL_DEQUANT_F16_GEMM": "0"}).dequant_f16_gemm is False
