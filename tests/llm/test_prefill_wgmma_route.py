"""The runner's route to prefill_wgmma (KernelOptions.prefill_wgmma, PYKERNEL_PREFILL_WGMMA=1):
forced onto the CPU target's tensor-core prefill, every layer's prompt attention launches
prefill_wgmma instead of prefill_flash, and the logits stay those of the mma path."""
import numpy as np
import pytest

from llm.generate import Session
from llm.options import RunnerOptions
from stdlib_kernels.options import KernelOptions
from tests.llm.gguf_helpers import TINY_LLAMA, require_for_module
from tests.llm.test_batching import d64_path, load, rel_l2  # noqa: F401 (fixture)

require_for_module(TINY_LLAMA)


def test_prefill_wgmma_option_from_env():
    assert not KernelOptions.from_env({}).prefill_wgmma
    assert KernelOptions.from_env({"PYKERNEL_PREFILL_WGMMA": "1"}).prefill_wgmma


@pytest.mark.slow
def test_prefill_wgmma_route_on_the_cpu_target(d64_path, monkeypatch):
    """13 new tokens after 9 cached ones, prefilled on the mma path and on prefill_wgmma: the
    launches per layer, and the last logits within the tolerance of the d64 model's f16
    tensor-core attention (tests/llm/test_prompt_batches.py: 2e-2 relative L2)."""
    from llm.backends import kernels_attention
    from tests.launch_helpers import launched_by
    import sys
    prefill = sys.modules["stdlib_kernels.attention.prefill"]
    monkeypatch.setattr(kernels_attention.KernelsAttention, "_tensor_core_prefill",
                        lambda self, k_cache: True)
    monkeypatch.setattr(prefill, "default_path", lambda k_cache, device=None: "mma")
    logits, launched = {}, {}
    for wgmma in (False, True):
        options = RunnerOptions(kernels=KernelOptions(prefill_wgmma=wgmma))
        model = load("cpu", "kernels", name=d64_path, n_ctx=64, kv_dtype="f16", graphs=False,
                     options=options)
        cfg = model.config
        cached = np.random.default_rng(1).integers(0, cfg.n_vocab, 9).tolist()
        prompt = np.random.default_rng(2).integers(0, cfg.n_vocab, 13).tolist()
        session = Session(model.transformer, model.backend, 32)
        session.prefill(cached)
        out = []
        launched[wgmma] = launched_by(lambda: out.append(session.prefill(prompt)[0]))
        logits[wgmma] = out[0]
    assert launched[True].count("prefill_wgmma") == cfg.n_layer, launched[True]
    assert "prefill_flash" not in launched[True]
    assert launched[False].count("prefill_flash") == cfg.n_layer, launched[False]
    err = rel_l2(logits[True], logits[False])
    assert err < 2e-2, f"logits on prefill_wgmma vs mma: relative L2 {err:.2e}"
