"""`pykernel perplexity` / llm.perplexity: llama.cpp's method (chunks of n_ctx from an empty
cache, BOS first, the second half scored) against the same arithmetic on the model's own
logits, against llama.cpp's logits for the tiny models (golden/tiny), on both backends, and
its errors and CLI."""
import json
import math

import numpy as np
import pytest

import llm
from llm.perplexity import perplexity
from tests.llm.cli_helpers import pykernel
from tests.llm.gguf_helpers import TINY, TINY_LLAMA, require_for_module

require_for_module(TINY / "tiny-logits.json")


def nll_of(logits: np.ndarray, ids: list, first: int) -> np.ndarray:
    """-log softmax(logits[j])[ids[j + 1]] for j in first .. len(ids) - 2, in float64."""
    x = np.asarray(logits, np.float64)[first:len(ids) - 1]
    top = x.max(axis=1, keepdims=True)
    log_total = top[:, 0] + np.log(np.exp(x - top).sum(axis=1))
    return log_total - x[np.arange(len(x)), np.asarray(ids[first + 1:])]


@pytest.mark.parametrize("backend", ["numpy", "kernels"])
def test_chunks_bos_and_second_halves(backend, rng, seed):
    model = llm.load(TINY_LLAMA, device="cpu", backend=backend, n_ctx=64, progress=False)
    ids = rng.integers(0, model.config.n_vocab, 3 * 16 + 5).tolist()
    seen = []
    result = perplexity(model, ids, n_ctx=16, progress=lambda *a: seen.append(a))
    bos = model.tokenizer.bos_id
    nll = []
    for c in range(3):                 # the 5 tokens past the last whole chunk are not read
        chunk = [bos] + ids[c * 16 + 1:(c + 1) * 16]
        nll.append(nll_of(model.logits(chunk), chunk, 8))
    expected = math.exp(np.concatenate(nll).mean())
    assert result.tokens_scored == 3 * 7 and result.chunks == 3
    assert abs(result.ppl / expected - 1) < 1e-6, f"seed {seed}: {result.ppl} vs {expected}"
    assert [s[:2] for s in seen] == [(1, 3), (2, 3), (3, 3)]
    assert result.running[-1] == result.ppl and 0 < result.ppl_error < result.ppl
    assert perplexity(model, ids, n_ctx=16, max_chunks=1).chunks == 1


@pytest.mark.parametrize("name", ["tiny-llama-f32.gguf", "tiny-qwen3-f32.gguf",
                                  "tiny-gpt2-f32.gguf"])
def test_matches_llama_cpp_logits(name):
    """One chunk of 16 of the golden 17-token text: the perplexity llama.cpp's own logits give
    for the same scored positions."""
    case = json.loads((TINY / "tiny-logits.json").read_text())[name][1]
    ids, logits = case["tokens"], np.asarray(case["logits"], np.float32)
    model = llm.load(TINY / name, n_ctx=32, progress=False)
    chunk = ids[:16]
    if model.tokenizer.vocab.add_bos:
        assert chunk[0] == model.tokenizer.bos_id
    expected = math.exp(nll_of(logits[:16], chunk, 8).mean())
    result = perplexity(model, chunk, n_ctx=16)
    assert abs(result.ppl / expected - 1) < 1e-3, (result.ppl, expected)


def test_errors_and_cli(tmp_path):
    model = llm.load(TINY_LLAMA, n_ctx=32, progress=False)
    with pytest.raises(ValueError, match="fewer than one chunk"):
        perplexity(model, "short", n_ctx=16)
    with pytest.raises(llm.ContextError, match="larger --ctx"):
        perplexity(model, "x " * 100, n_ctx=64)
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 12)
    out = pykernel("perplexity", "--model", TINY_LLAMA, "-f", text, "--ctx", "32",
                   "--chunks", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Final estimate: PPL = ") and "in 2 chunks of 32" in out.stdout
    assert "[1]" in out.stderr and "[2]" in out.stderr
    missing = pykernel("perplexity", "--model", TINY_LLAMA, "-f", tmp_path / "none.txt")
    assert missing.returncode == 1 and missing.stderr.startswith("pykernel: error: ")


@pytest.mark.gpu
def test_gpu_matches_numpy(rng, seed):
    import pykernel as pk
    if not pk.gpu_available():
        pytest.skip("no usable CUDA GPU (driver or device missing)")
    ids = rng.integers(0, 263, 2 * 32).tolist()
    gpu = llm.load(TINY_LLAMA, device="cuda", n_ctx=64, progress=False)
    cpu = llm.load(TINY_LLAMA, device="cpu", n_ctx=64, progress=False)
    a, b = perplexity(gpu, ids, n_ctx=32).ppl, perplexity(cpu, ids, n_ctx=32).ppl
    assert abs(a / b - 1) < 5e-3, f"seed {seed}: cuda {a} vs numpy {b}"
