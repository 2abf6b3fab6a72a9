"""The runner's weight matmul (kernels_weights.matmul) with RunnerOptions(kernels=
KernelOptions(hopper_quant_gemm=True)) on the CPU target: each row group's GEMM is
gemm_hopper_quant, writing its columns of the output plus the residual (place_columns), bit-equal
to the per-group stdlib launch plus the residual, workspaces from the runner's scratch; the
PYKERNEL_HOPPER_QUANT_GEMM variable reaches the runner's kernel options."""
import importlib

import numpy as np

import pykernel as pk
from llm.backends import kernels_weights as W
from llm.options import KERNEL_VARIABLES, RunnerOptions
from stdlib_kernels.options import KernelOptions
from stdlib_kernels.quant import reference as ref
from stdlib_kernels.quant.gemv import weight_words
from tests.launch_helpers import launched_by

M = importlib.import_module("stdlib_kernels.quant.matmul")
OPTIONS = RunnerOptions(kernels=KernelOptions(hopper_quant_gemm=True)).kernel_options


def _group(rng, type_name, rows, row_off, n):
    raw = pk.to_device(ref.quantize(rng.standard_normal((rows, n)).astype(np.float32),
                                    type_name))
    return W.RowGroup(type_name, rows, row_off, raw, weight_words(raw, type_name, n)[0])


def test_groups_write_their_columns_plus_the_residual(rng, seed, cpu_device):
    n, tokens = 256, 11                     # q|k|v-like: Q8_0 (24 rows) then Q4_K (16 rows)
    groups = [_group(rng, "Q8_0", 24, 0, n), _group(rng, "Q4_K", 16, 24, n)]
    w = W.DeviceMatrix(n, 40, groups, ("a", "b"), (24, 16))
    x = pk.to_device(rng.standard_normal((tokens, n)).astype(np.float32))
    xq = pk.empty(W.q8_buffer_shape(tokens, n), np.uint8)
    W.quantize_activations(x, xq)
    res = rng.standard_normal((tokens, 40)).astype(np.float32)
    out = pk.full((tokens, 40), np.nan, np.float32)
    taken = []

    def scratch(shape):
        taken.append(shape)
        return pk.full(shape, np.nan, np.float32)
    launches = launched_by(lambda: W.matmul(x, w, out, xq, scratch, OPTIONS,
                                            res=pk.to_device(res)))
    parts = []
    for g in groups:
        c = pk.full((tokens, g.rows), np.nan, np.float32)
        M.hopper_quant_into(g.words, g.type_name, x, c, g.rows, n, tokens)
        parts.append(c.numpy())
    np.testing.assert_array_equal(out.numpy(), np.concatenate(parts, axis=1) + res,
                                  err_msg=f"seed {seed}")
    assert launches.count("gemm_q_tn") == 2 and launches.count("place_columns") == 2, launches
    assert taken, "the workspaces come from the runner's scratch"


def test_the_variable_reaches_the_runner(monkeypatch):
    assert "PYKERNEL_HOPPER_QUANT_GEMM" in KERNEL_VARIABLES
    assert not RunnerOptions().kernel_options.hopper_quant_gemm
    monkeypatch.setenv("PYKERNEL_HOPPER_QUANT_GEMM", "1")
    assert RunnerOptions.from_env().kernel_options.hopper_quant_gemm
