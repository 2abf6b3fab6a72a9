"""Every architecture against llama.cpp: the tiny random models' token ids and logits at every
position (golden/tiny/tiny-logits.json, f32 KV cache), by full prefill and token by token."""
import json

import numpy as np
import pytest

import llm
from tests.llm.gguf_helpers import TINY, require_for_module

require_for_module(TINY / "tiny-logits.json")
CASES = json.loads((TINY / "tiny-logits.json").read_text())
F32_TOL = 1e-3      # measured: ~1e-6 (llama, qwen2, qwen3), ~3e-4 (gpt2: ggml's f16 GELU table)
Q8_0_TOL = 2e-2     # with llama.cpp's activation quantization emulated (measured ~2.5e-7)
Q8_0_F32_ACT_TOL = 4e-2  # float32 activations differ from llama.cpp's Q8_0 ones (~2.3-2.8e-2)


def rel_l2(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def models():
    return {name: llm.load(TINY / name, n_ctx=64) for name in CASES}


@pytest.mark.parametrize("name", sorted(CASES))
def test_tokens_and_logits(models, name):
    model = models[name]
    tol = Q8_0_F32_ACT_TOL if "q8_0" in name else F32_TOL
    for case in CASES[name]:
        ids = model.tokenizer.encode(case["text"])
        assert ids == case["tokens"], case["text"]
        err = rel_l2(model.logits(ids), np.asarray(case["logits"], dtype=np.float32))
        assert err < tol, f"{name} {case['text']!r}: relative L2 {err:.2e}"


def test_q8_0_matches_llama_cpp_with_quantized_activations():
    name = "tiny-llama-q8_0.gguf"
    model = llm.load(TINY / name, n_ctx=64, quantized_activations=True)
    for case in CASES[name]:
        err = rel_l2(model.logits(case["tokens"]), np.asarray(case["logits"], np.float32))
        assert err < Q8_0_TOL, f"{case['text']!r}: relative L2 {err:.2e}"
        assert err < 1e-4, f"emulation drifted from llama.cpp's arithmetic: {err:.2e}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_incremental_decode_equals_prefill(models, name):
    """Token-by-token through the KV cache gives the same logits as one prefill."""
    model = models[name]
    ids = CASES[name][1]["tokens"]
    full = model.logits(ids)
    session = model.session()
    session.reset()
    steps = [session.prefill(ids[:3])[0]] + [session.step(t) for t in ids[3:]]
    assert rel_l2(np.stack(steps), full[2:]) < 1e-5
