"""Tensor parallelism on the kernels backend, CPU target: the tiny models over 2 in-process ranks
against the unsharded kernels model (bound as in test_tensor_parallel: F32_FACTOR times the
unsharded model's float32 forward error, measured against the float64 numpy reference), greedy
tokens identical; and a `gpu` test of the same over NCCL, one process per GPU."""
import numpy as np
import pytest

import llm
from tests.llm.gguf_helpers import TINY, require_for_module
from tests.llm.test_tensor_parallel import (
    F32_FACTOR,
    assert_same_greedy,
    float64_logits,
    greedy,
    prompt_ids,
)

require_for_module(TINY / "tiny-llama-f32.gguf")


def compare(name: str, tp: int, device: str, rng, **options) -> None:
    ids = prompt_ids(rng, 263)
    whole = llm.load(TINY / name, device=device, backend="kernels", n_ctx=64, progress=False,
                     **options)
    split = llm.load(TINY / name, device=device, backend="kernels", n_ctx=64, progress=False,
                     tp=tp, **options)
    reference = whole.logits(ids)
    bound = F32_FACTOR * np.abs(reference - float64_logits(TINY / name, ids, 1)).max()
    err = np.abs(split.logits(ids) - reference).max()
    assert err <= bound, f"{name} tp={tp}: max |diff| {err:.3e} > bound {bound:.3e}"
    assert_same_greedy(greedy(whole, ids, 8), greedy(split, ids, 8), bound, f"{name} tp={tp}")
    text = [("".join(m.generate(ids, max_tokens=8, temperature=0))) for m in (whole, split)]
    assert text[0] == text[1]


@pytest.mark.parametrize("name,tp", [("tiny-qwen2-f32.gguf", 2), ("tiny-llama-q8_0.gguf", 2),
                                     ("tiny-llama-f32.gguf", 4)])   # tp 4: KV heads replicated
def test_kernels_backend_on_the_cpu_target(rng, name, tp):
    compare(name, tp, "cpu", rng)


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("name,tp", [("tiny-qwen2-f32.gguf", 2), ("tiny-llama-q8_0.gguf", 2)])
def test_nccl_one_process_per_gpu(rng, name, tp, graphs):
    """Needs tp GPUs and nccl4py: rank 0 here, ranks 1.. as llm.parallel.worker processes."""
    from cuda.bindings import driver
    err, count = driver.cuDeviceGetCount()
    if err or count < tp:
        pytest.skip(f"needs {tp} GPUs (this machine has {count})")
    pytest.importorskip("nccl.core", reason="nccl4py is not installed")
    compare(name, tp, "cuda", rng, graphs=graphs)
