"""The runner's weight matmuls above 8 tokens (llm/backends/kernels_weights.matmul): the prefill
GEMMs write each row group's columns of the output (no copy launch) and, for short prompts,
add the residual in their store; the result must equal the per-group GEMMs plus the
residual."""
import numpy as np
import pytest

import pykernel as pk
from llm.backends import kernels_weights as W
from llm.options import RunnerOptions
from stdlib_kernels.quant import reference as ref
from stdlib_kernels.quant.gemm import gemm
from stdlib_kernels.quant.gemm_q8 import gemm_q8
from stdlib_kernels.quant.gemv import weight_words
from tests.launch_helpers import launched_by


def make_group(rng, type_name: str, rows: int, row_off: int, n: int) -> W.RowGroup:
    raw = ref.quantize(rng.standard_normal((rows, n)).astype(np.float32), type_name)
    dev = pk.to_device(raw)
    return W.RowGroup(type_name, rows, row_off, dev, weight_words(dev, type_name, n)[0])


OPTIONS = RunnerOptions().kernel_options      # the runner's routing (its defaults)


def scratch(shape):
    return pk.empty(shape, np.float32)


@pytest.mark.parametrize("tokens", [11, W.GEMM_RESIDUAL_TOKENS + 6])
def test_mixed_type_groups_with_residual_in_the_gemm_store(device, rng, seed, tokens):
    # q|k|v-like: a Q4_0 group (int8 GEMM) then a Q2_K group (f16 GEMM); the residual in the
    # GEMMs' store up to GEMM_RESIDUAL_TOKENS tokens, else one add launch
    n = 256
    groups = [make_group(rng, "Q4_0", 24, 0, n), make_group(rng, "Q2_K", 16, 24, n)]
    w = W.DeviceMatrix(n, 40, groups, ("a", "b"), (24, 16))
    x = rng.standard_normal((tokens, n)).astype(np.float32)
    res = rng.standard_normal((tokens, 40)).astype(np.float32)
    xd = pk.to_device(x)
    xq = pk.empty(W.q8_buffer_shape(tokens, n), np.uint8)
    W.quantize_activations(xd, xq)
    out = pk.full((tokens, 40), np.nan, np.float32)
    launches = launched_by(lambda: W.matmul(xd, w, out, xq, scratch, OPTIONS,
                                            res=pk.to_device(res)))
    want = np.concatenate([gemm_q8(groups[0].raw.numpy(), "Q4_0", x).numpy(),
                           gemm(groups[1].raw.numpy(), "Q2_K", x).numpy()], axis=1) + res
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6, atol=1e-5, err_msg=f"seed {seed}")
    fused = tokens <= W.GEMM_RESIDUAL_TOKENS
    assert len(launches) == (2 if fused else 3), launches   # a GEMM per group, no copy


@pytest.mark.parametrize("residual", [False, True])
def test_one_token_mixed_types_in_one_gemv_launch(device, rng, seed, residual):
    # Q4_K_M's q|k (Q4_K) + v (Q6_K) for one token: one gemv_pair launch, each group's
    # columns equal to its own GEMV (+ the residual, or a one-token bias, in the store)
    from stdlib_kernels.quant.gemv import gemv_q8_into
    n = 512
    groups = [make_group(rng, "Q4_K", 40, 0, n), make_group(rng, "Q6_K", 24, 40, n)]
    w = W.DeviceMatrix(n, 64, groups, ("qk", "v"), (40, 24))
    xd = pk.to_device(rng.standard_normal((1, n)).astype(np.float32))
    xq = pk.empty(W.q8_buffer_shape(1, n), np.uint8)
    W.quantize_activations(xd, xq)
    res = pk.to_device(rng.standard_normal((1, 64)).astype(np.float32)) if residual else None
    want = []
    for g in groups:
        y = pk.empty((1, g.rows), np.float32)
        gemv_q8_into(g.words, g.type_name, xq, y, g.rows, n)
        want.append(y.numpy())
    want = np.concatenate(want, axis=1) + (res.numpy() if residual else 0)
    out = pk.full((1, 64), np.nan, np.float32)
    launches = launched_by(lambda: W.matmul(xd, w, out, xq, scratch, OPTIONS, res=res))
    assert len(launches) == 1 and launches[0].startswith("gemv_q8_pair_kernel"), launches
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6, atol=1e-5, err_msg=f"seed {seed}")


def test_the_routing_options_come_from_the_runner_options(device, rng, monkeypatch):
    """One value: the kernels backend's RunnerOptions carries the KernelOptions the weight
    matmuls route by (the runner's two choices always added); the environment is read by
    RunnerOptions.from_env only, and a routing call takes the options it is given."""
    import re
    from llm.options import KERNEL_VARIABLES
    from stdlib_kernels import options as kernel_options
    from stdlib_kernels.options import KernelOptions
    # llm names the variables without importing stdlib: the same set that from_env reads
    source = open(kernel_options.__file__).read()
    assert set(re.findall(r"PYKERNEL_\w+", source)) == set(KERNEL_VARIABLES)
    for name in KERNEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert OPTIONS == KernelOptions(f32_weights_gemv=True, route_by_format=True)
    assert RunnerOptions.from_env().kernels is None
    monkeypatch.setenv("PYKERNEL_INT8_GEMM_TOKENS", "9")
    monkeypatch.setenv("PYKERNEL_DECODE_BULK", "1")
    from_env = RunnerOptions.from_env().kernel_options
    assert (from_env.int8_gemm_tokens, from_env.decode_bulk, from_env.route_by_format) == \
        (9, True, True)
    assert RunnerOptions().kernel_options == OPTIONS          # set by hand: no environment
    with pytest.raises(TypeError, match="must be a stdlib_kernels.options.KernelOptions"):
        RunnerOptions(kernels={"int8_gemm_tokens": 9}).kernel_options
    later = RunnerOptions(kernels=KernelOptions(int8_gemm_tokens=9)).kernel_options
    assert later.f32_weights_gemv and later.route_by_format
    q8_0 = make_group(rng, "Q8_0", 8, 0, 64)
    assert W.uses_gemm(q8_0, 7, OPTIONS) and not W.uses_gemm(q8_0, 7, later)
    assert not W.gemv_launch(q8_0, 7, OPTIONS) and W.gemv_launch(q8_0, 7, later)


def test_runner_options_import_no_kernel_code():
    """`import llm` and RunnerOptions.from_env() (which the numpy backend runs) import neither
    stdlib_kernels nor pykernel while no kernel variable is set."""
    import os
    import subprocess
    import sys
    from llm.options import KERNEL_VARIABLES
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    code = ("import sys, llm; llm.RunnerOptions.from_env(); "
            "print(sorted(m for m in ('pykernel', 'stdlib_kernels') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]", out
