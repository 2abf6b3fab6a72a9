"""The kernels backend's Q8_1 path (quantized activations into the DP4A GEMV and the int8 GEMM,
the GPU's code path, here on the CPU target) is as accurate as an exact Q8_1 model.

The reference is the numpy backend emulating the same activation rounding (`act_quant`: each
matmul's input rounded to 32-value blocks, d = amax/127, then an exact f32 product). Both are
measured against the f32 path on the same tiny model (tiny-llama's weights in a format with a
min, where the convention of Q8_1's block sum s matters).

The bound is derived, not fitted. The kernel path computes the same rounded activations; it
differs from the emulation only by the f16 rounding of s and the f32 summation order, which move
a few activations of the next matmul across a rounding step. Those moves are themselves Q8_1
rounding errors, independent of the emulation's and at most as many, so the two add in
quadrature: error(kernels) <= sqrt(2) * error(emulation). The old s = sum(x) convention left the
un-centred part of the weights with its rounding errors uncancelled and measured 2.1x (and 4.5e-2
against 0.7e-3 on SmolLM2's prompts, issue 40)."""
import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType

import llm
from llm.gguf_file import GGUFFile
from stdlib_kernels.quant import reference as ref
from tests.llm.gguf_helpers import TINY_LLAMA, rewrite

# prompts of 1 token (the DP4A GEMV) and 12 tokens (the int8 GEMM: INT8_GEMM_TOKENS and up)
PROMPTS = [[5], [17], [5, 9, 31, 44, 2, 77, 120, 8, 64, 33, 250, 14],
           [200, 3, 3, 91, 18, 45, 62, 7, 130, 11, 99, 240]]


def rel_l2(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module", params=["Q4_1", "Q5_1", "Q4_0"])
def quantized_tiny(request, tmp_path_factory):
    """tiny-llama with every matrix quantized to one type (norms stay f32)."""
    fmt = request.param
    tensors = {}
    for t in GGUFFile(TINY_LLAMA).tensors.values():
        if len(t.shape) == 2:
            w = np.asarray(t.data).view(np.float32).reshape(t.shape)
            tensors[t.name] = (ref.quantize(w, fmt), GGMLQuantizationType[fmt])
    path = tmp_path_factory.mktemp("q8_1") / f"tiny-llama-{fmt.lower()}.gguf"
    return fmt, rewrite(TINY_LLAMA, path, tensors=tensors)


def logits_of(path, prompts, **options):
    model = llm.load(path, device="cpu", n_ctx=64, progress=False, **options)
    return [model.logits(ids) for ids in prompts]


def mean_error(runs, reference) -> float:
    return float(np.mean([rel_l2(a, b) for a, b in zip(runs, reference)]))


def test_q8_1_path_is_as_accurate_as_exact_activation_rounding(quantized_tiny):
    fmt, path = quantized_tiny
    exact = logits_of(path, PROMPTS, backend="numpy")
    emulated = mean_error(logits_of(path, PROMPTS, backend="numpy", quantized_activations=True),
                          exact)
    kernels = mean_error(logits_of(path, PROMPTS, backend="kernels", activations="q8_1",
                                   gemv=True), exact)
    assert emulated > 1e-3, f"{fmt}: the emulation rounded nothing ({emulated:.2e})"
    assert kernels <= math.sqrt(2) * emulated, (
        f"{fmt}: the Q8_1 path is {kernels:.2e} from f32, an exact Q8_1 rounding "
        f"{emulated:.2e} (bound sqrt(2) x)")
