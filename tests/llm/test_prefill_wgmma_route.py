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
    import sys

    from llm.backends import kernels_attention
    from tests.launch_helpers import launched_by
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


@pytest.mark.gpu
def test_gpu_prefill_wgmma_logits_match_mma(tmp_path):
    """On an sm_90 GPU with the runner's production settings: a 96-token prompt (head_dim 64,
    SmolLM2's shape, random weights) prefilled with prefill_wgmma vs prefill_flash, eager and
    through the prefill graph (start on the device): logits within the mma-vs-simt tolerance
    of tests/llm/test_kernels_backend_gpu.py (5e-3), and a launch of prefill_wgmma per layer."""
    import llm
    import pykernel as pk
    from llm.synth import write_synthetic
    from tests.launch_helpers import launched_by
    if not pk.gpu_available():
        pytest.skip("no usable CUDA GPU (driver or device missing)")
    pk.set_device("cuda")
    if pk.current_device().arch != "sm_90":
        pytest.skip("wgmma needs an sm_90 GPU")
    path = write_synthetic("smollm2-135m", "Q4_0", tmp_path / "smol.gguf")
    ids = list(np.random.default_rng(1).integers(0, 49000, 96))
    logits = {}
    for wgmma in (False, True):
        for graphs in (False, True):
            options = RunnerOptions(kernels=KernelOptions(prefill_wgmma=wgmma),
                                    prefill_graphs=graphs)
            model = llm.load(path, device="cuda", n_ctx=128, progress=False, options=options)
            out = []
            names = launched_by(lambda: out.append(model.logits(ids)))
            if wgmma and not graphs:
                assert names.count("prefill_wgmma") == model.config.n_layer, names
            logits[wgmma, graphs] = out[0]
    for graphs in (False, True):
        err = rel_l2(logits[True, graphs], logits[False, graphs])
        assert err < 5e-3, f"graphs {graphs}: wgmma vs mma prefill logits {err:.2e}"
