"""The runner with RunnerOptions(kernels=KernelOptions(dequant_f16_gemm=True)) on the CPU target
(the stdlib GEMV/GEMM routes, gemv=True): prompts of at least dequant_f16_tokens tokens run
every weight matmul on f16 weights dequantized into the model's one f16 scratch (sized for its
largest layer row group) and gemm_hopper, and the tiny Q8_0 llama's logits stay within the bound
f16 weights and activations imply against the default route's Q8_1 activations; shorter prompts
keep the default launches, and are closer to the f32 arithmetic of the numpy backend than the
default route's by the factor below; the variables reach the runner.

The bound: the default route multiplies Q8_1 activations (each value within half a step, up to
2^-8 of its 32-block's largest magnitude) by the exact weights; this route multiplies f16
activations by f16 weights (each within 2^-11 relative of x and of w). Against f32 activations
and exact weights (the numpy backend's arithmetic) the default route's logits are therefore the
farther of the two: tests/llm/test_tiny_models.py bounds the Q8_0 model's f32-activation logits
against llama.cpp (= the default route's, to 2.5e-7) by Q8_0_F32_ACT_TOL = 4e-2 (measured
2.3-2.8e-2), and this route's per-product error, 2 x 2^-11, is at most 1/8 of Q8_1's 2^-8; so
|this - default| <= (1 + 1/8) 4e-2 in relative L2, and |this - numpy| <= |default - numpy| / 8
(measured: 2.4-2.8e-2 from the default, 1.2-1.4e-3 from numpy against the default's 2.4-2.8e-2)."""
from dataclasses import replace

import json

import numpy as np
import pytest

import llm
from llm.options import KERNEL_VARIABLES, RunnerOptions
from stdlib_kernels.options import KernelOptions
from tests.launch_helpers import launched_by
from tests.llm.gguf_helpers import TINY, require_for_module

require_for_module(TINY / "tiny-logits.json")
NAME = "tiny-llama-q8_0.gguf"
CASES = json.loads((TINY / "tiny-logits.json").read_text())[NAME]
THRESHOLD = 9                       # the GEMMs' prompts (past the 8-token GEMV)
ON = RunnerOptions(prefill_graphs=False,
                   kernels=KernelOptions(dequant_f16_gemm=True, dequant_f16_tokens=THRESHOLD))
ROUTE_TOL = (1 + 1 / 8) * 4e-2


def rel_l2(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _load(options):
    return llm.load(TINY / NAME, device="cpu", backend="kernels", n_ctx=64, gemv=True,
                    options=options, progress=False)


@pytest.fixture(scope="module")
def models():
    return (_load(replace(ON, kernels=KernelOptions())), _load(ON),
            llm.load(TINY / NAME, device="cpu", backend="numpy", n_ctx=64, progress=False))


def test_prompts_take_the_route_within_the_derived_bound(models):
    default, route, numpy_model = models
    for case in CASES:
        ids = case["tokens"]
        want = default.logits(ids)
        names = []
        got = None

        def run():
            nonlocal got
            got = route.logits(ids)
        names = launched_by(run)
        taken = len(ids) >= THRESHOLD
        assert ("dequant_f16_flat" in names) == taken, (len(ids), sorted(set(names)))
        if not taken:
            np.testing.assert_array_equal(got, want)
            continue
        assert "gemm_q8_kernel" not in " ".join(names), sorted(set(names))
        err = rel_l2(got, want)
        assert 0 < err < ROUTE_TOL, f"{case['text']!r}: relative L2 vs the default {err:.2e}"
        exact = numpy_model.logits(ids)
        assert rel_l2(got, exact) < rel_l2(want, exact) / 8, (rel_l2(got, exact),
                                                               rel_l2(want, exact))


def test_one_f16_scratch_sized_for_the_largest_layer_group(models):
    route = models[1]
    backend = route.backend
    route.logits(CASES[1]["tokens"])
    scratch = backend.weights16
    assert scratch is not None and scratch.dtype == np.float16
    cfg = route.config
    # gate|up, stacked in one row group, is the largest: 2 n_ff x n_embd values
    assert scratch.size == backend.weights.largest_layer_group == 2 * cfg.n_ff * cfg.n_embd
    route.logits(CASES[3]["tokens"])
    assert backend.weights16 is scratch, "allocated once per model"
    without = models[0].backend.memory_report()["scratch"]      # the default route's model
    assert backend.memory_report()["scratch"] == without + scratch.nbytes, "in the report"


def test_the_variables_reach_the_runner(monkeypatch):
    for name in ("PYKERNEL_DEQUANT_F16_GEMM", "PYKERNEL_DEQUANT_F16_TOKENS"):
        assert name in KERNEL_VARIABLES
    assert RunnerOptions().kernel_options.dequant_f16_gemm is None      # by device
    monkeypatch.setenv("PYKERNEL_DEQUANT_F16_GEMM", "1")
    monkeypatch.setenv("PYKERNEL_DEQUANT_F16_TOKENS", "512")
    options = RunnerOptions.from_env().kernel_options
    assert options.dequant_f16_gemm and options.dequant_f16_tokens == 512
