"""quant.matmul's route to gemm_hopper_quant (KernelOptions.hopper_quant_gemm): on the CPU target
(which emulates sm_90a) a 16-token Q8_0 / Q4_K matmul_into launches it and agrees with the
default route (int8 kernels on Q8_1 activations) within the bound derived from both routes'
roundings of x (f16 vs Q8_1) and of the weights (f16 vs exact); with the option off the
launches are the default route's; the rule's arch, format and K conditions; the column offset
and residual contract (place_columns) bit-exact."""
import dataclasses
import importlib

import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels.options import KernelOptions
from stdlib_kernels.quant import reference as ref
from stdlib_kernels.quant.gemv import weight_words
from stdlib_kernels.quant.q8_1 import q8_1_bytes
from tests.runtime.fakes import mock_cuda_device

M = importlib.import_module("stdlib_kernels.quant.matmul")   # the package shadows the module
ON = KernelOptions(hopper_quant_gemm=True)
F16_HALF_ULP = 2.0 ** -11          # round to nearest f16: relative error of a normal value
F32_UNIT = 2.0 ** -24
HOPPER_LAUNCHES = {"convert_rows8", "gemm_q_tn", "place_columns"}


def _problem(rng, type_name, tokens, rows, K):
    x = rng.standard_normal((tokens, K)).astype(np.float32)
    raw = ref.quantize(rng.standard_normal((rows, K)).astype(np.float32), type_name)
    return x, raw


def _run(raw, type_name, x, rows, options):
    """(y, launch names) of matmul_into with a Q8_1 workspace at hand, y poisoned first."""
    tokens, K = x.shape
    words, _ = weight_words(pk.to_device(raw), type_name, K)
    xd = pk.to_device(x)
    xq = pk.zeros((tokens, q8_1_bytes(K)), np.uint8)
    y = pk.full((tokens, rows), np.nan, np.float32)
    with pk.capture_graph() as graph:
        M.matmul_into(words, type_name, xd, y, rows, K, tokens, xq=xq, options=options)
    graph.replay()
    return y.numpy(), [launch.name for launch in graph.launches]


def _bound(x, raw, type_name, rows):
    """|hopper - default| per output: sum_k |w_k| |f16(x_k) - q8_1(x_k)| (the activations),
    + 2^-11 |w_k x16_k| (the weights rounded to f16) + 2^-22 |x16_k| (|w_k| + 2 min_k) (f32
    roundings inside decode8's d sc q - dmin m) + Q4_K's block sums s (f16) x 2^-11 x its
    largest min (63 dmin) + both routes' f32 sums, (K + 16) 2^-24 sum |x w| each."""
    tokens, K = x.shape
    w = ref.dequantize(raw, type_name, K).reshape(rows, K).astype(np.float64)
    x16 = x.astype(np.float16).astype(np.float64)
    xq = ref.dequantize(ref.quantize(x, "Q8_1"), "Q8_1", K).reshape(tokens, K).astype(
        np.float64)
    aw, big = np.abs(w), np.abs(x16) + np.abs(xq)
    bound = np.abs(x16 - xq) @ aw.T + F16_HALF_ULP * np.abs(x16) @ aw.T
    bound += 2 * (K + 16) * F32_UNIT * big @ aw.T
    if type_name == "Q4_K":
        dmin = raw.reshape(rows, -1, 144)[:, :, 2:4].copy().view(np.float16)[..., 0]
        min_max = 63 * np.abs(dmin.astype(np.float64))                    # (rows, K / 256)
        sums = np.abs(xq.reshape(tokens, K // 32, 32).sum(-1))            # (tokens, K / 32)
        per_super = sums.reshape(tokens, K // 256, 8).sum(-1)
        bound += F16_HALF_ULP * per_super @ min_max.T
        bound += 4 * F32_UNIT * np.abs(x16) @ (aw + 2 * np.repeat(min_max, 256, 1)).T
    return bound


def check_route(type_name, rows, K, tokens, options, path, launches, rng, seed):
    """`options` sends this matmul to `path`, whose run launches `launches` (which the default
    route's does not) and stays within _bound of the default route's result."""
    x, raw = _problem(rng, type_name, tokens, rows, K)
    assert M.choose_matmul_path(type_name, tokens, True, options, k=K) == path
    want, default_names = _run(raw, type_name, x, rows, KernelOptions())
    got, names = _run(raw, type_name, x, rows, options)
    assert launches <= set(names) and not set(default_names) & launches, (names,
                                                                          default_names)
    assert np.isfinite(got).all(), f"seed {seed}"
    excess = np.abs(got.astype(np.float64) - want) - _bound(x, raw, type_name, rows)
    assert (excess <= 0).all(), f"seed {seed}: worst excess {excess.max():.3e}"


@pytest.mark.parametrize("type_name, rows, K", [("Q8_0", 72, 512), ("Q4_K", 72, 512)])
def test_option_routes_prompts_to_hopper_quant(type_name, rows, K, rng, seed, cpu_device):
    check_route(type_name, rows, K, 16, ON, M.GEMM_HOPPER_Q, {"gemm_q_tn"}, rng, seed)


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_K"])
def test_option_off_keeps_the_default_launches(type_name, rng, cpu_device):
    x, raw = _problem(rng, type_name, 16, 72, 512)
    default = _run(raw, type_name, x, 72, KernelOptions())
    off = _run(raw, type_name, x, 72, dataclasses.replace(ON, hopper_quant_gemm=False))
    assert default[1] == off[1] and not set(off[1]) & HOPPER_LAUNCHES, off[1]
    np.testing.assert_array_equal(default[0], off[0])


def test_rule_needs_sm_90_a_served_format_k_and_tokens():
    sm90, sm80, sm100 = (mock_cuda_device(a) for a in ("sm_90", "sm_80", "sm_100"))
    rule = M.choose_matmul_path
    assert rule("Q4_K", 16, True, ON, k=512, device=sm90) == M.GEMM_HOPPER_Q
    assert rule("Q4_K", 16, True, ON, k=512, device=sm80) == M.GEMV_MMA
    assert rule("Q4_K", 16, True, ON, k=512, device=sm100) == M.GEMV_MMA
    assert rule("Q8_0", 64, True, ON, k=512, device=sm90) == M.GEMM_HOPPER_Q
    assert rule("Q8_0", 64, True, ON, device=sm90) == M.GEMM_Q8            # no k: not taken
    assert rule("Q8_0", 64, True, ON, k=96, device=sm90) == M.GEMM_Q8      # not 256 x n
    assert rule("Q6_K", 64, True, ON, k=1024, device=sm90) == M.GEMM_Q8    # 840 B rows
    assert rule("Q6_K", 64, True, ON, k=2048, device=sm90) == M.GEMM_HOPPER_Q
    assert rule("F16", 64, False, ON, k=512, device=sm90) == M.GEMM_F16    # not served
    assert rule("Q8_0", 4, True, ON, k=512, device=sm90) == M.GEMV         # below the GEMMs
    late = dataclasses.replace(ON, int8_gemm_tokens=32)
    assert rule("Q8_0", 16, True, late, k=512, device=sm90) == M.GEMM_Q8
    assert rule("Q8_0", 64, True, KernelOptions(), k=512, device=sm90) == M.GEMM_Q8


def test_env_variable_sets_the_option():
    assert KernelOptions.from_env({"PYKERNEL_HOPPER_QUANT_GEMM": "1"}).hopper_quant_gemm
    assert not KernelOptions.from_env({"PYKERNEL_HOPPER_QUANT_GEMM": "0"}).hopper_quant_gemm
    assert not KernelOptions.from_env({}).hopper_quant_gemm


def test_column_offset_and_residual_bit_exact(rng, seed, cpu_device):
    """C into columns 20..92 of y (16, 100) plus res, y aliasing res: C (the in-place launch's
    result) + res, the other columns untouched."""
    tokens, rows, K, ldy, col0 = 16, 72, 256, 100, 20
    x, raw = _problem(rng, "Q8_0", tokens, rows, K)
    words, _ = weight_words(pk.to_device(raw), "Q8_0", K)
    xd = pk.to_device(x)
    c = pk.full((tokens, rows), np.nan, np.float32)
    M.hopper_quant_into(words, "Q8_0", xd, c, rows, K, tokens)
    res = rng.standard_normal((tokens, ldy)).astype(np.float32)
    y = pk.to_device(res)
    M.hopper_quant_into(words, "Q8_0", xd, y, rows, K, tokens, ldy=ldy, col0=col0, res=y)
    want = res.copy()
    want[:, col0:col0 + rows] += c.numpy()
    np.testing.assert_array_equal(y.numpy(), want, err_msg=f"seed {seed}")


@pytest.mark.parametrize("arch", ["sm_75", "sm_90"])
def test_place_columns_ptx_assembles(arch, assemble):
    for has_res in (False, True):
        assemble(M.place_columns.ptx(arch, HAS_RES=has_res), arch)
