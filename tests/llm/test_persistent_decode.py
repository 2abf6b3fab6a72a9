"""The persistent decode step (llm/backends/persistent_decode.py, stdlib_kernels/persistent/
decode.py) on the tiny llama file, CPU target: a random prompt prefilled through the runner,
then several decode tokens through the persistent kernel against the kernels backend's own
decode logits (its decode graph) and K/V rows, a replayed launch, and the refusals."""
import functools

import numpy as np
import pytest

import llm
from llm.backends.persistent_decode import PersistentDecode, UnsupportedModel
from tests.llm.gguf_helpers import TINY

N_CTX = 48
STEPS = 4
EPS32 = float(np.finfo(np.float32).eps)


@functools.cache
def _load(name: str, activations: str = "q8_1"):
    return llm.load(TINY / name, device="cpu", backend="kernels", n_ctx=N_CTX, progress=False,
                    activations=activations)


@pytest.fixture
def model():
    return _load("tiny-llama-f32.gguf")


def dot_path_length(cfg, pos: int) -> int:
    """Terms summed along one token's path to a logit: per layer the QKV, score, softmax-
    weighted V, output, gate/up and down dots, then the LM head's."""
    per_layer = (cfg.n_embd + cfg.head_dim + (pos + 1) + cfg.n_head * cfg.head_dim
                 + cfg.n_embd + cfg.n_ff)
    return cfg.n_layer * per_layer + cfg.n_embd


def logits_bound(cfg, pos: int, ref: np.ndarray) -> float:
    """Both paths compute the same f32 operations but sum in different orders (the backend's
    CPU GEMV, stdlib attention vs warp-per-row dots here). A dot of n terms in f32 is off by
    at most ~n eps/2 relative to its terms' magnitude (Higham's gamma_n); to first order the
    errors of the stages add up along the path, the RMS norms keep each stage's input O(1)
    relative to its output, so the two logits differ by at most ~2 (both paths) x the sum of
    the dot lengths x eps/2 x the logits' scale."""
    return dot_path_length(cfg, pos) * EPS32 * max(1.0, float(np.abs(ref).max()))


def _prefill(model, rng, prompt_len: int):
    cfg, b = model.config, model.backend
    cache = b.kv_cache(cfg.n_layer, N_CTX, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v)
    prompt = rng.integers(0, cfg.n_vocab, prompt_len).tolist()
    logits = b.to_host(model.transformer.forward_tokens(prompt, 0, cache))[-1]
    return cache, prompt, logits


@pytest.mark.parametrize("name,grid,tile_rows", [
    ("tiny-llama-f32.gguf", 3, 16), ("tiny-llama-f32.gguf", 1, 5),
    ("tiny-llama-f32.gguf", 40, 7), ("tiny-llama-q8_0.gguf", 5, 16)])
def test_decode_steps_match_runner(rng, name, grid, tile_rows):
    """Greedy tokens after a random prompt: each step's logits from the persistent launch vs
    the runner's decode step on its own cache (the same token and position), and the K/V row
    each wrote. Grid 1 runs every item in one block; 40 is more blocks than some stages'
    items (the queue hands the rest nothing). Q8_0: the hook expands the weights to f32
    (exactly: a Q8_0 value is an int8 times an f16 scale), so the runner runs with f32
    activations too (its default Q8_1 activations round them: a different step)."""
    model = _load(name, "f32" if "q8_0" in name else "q8_1")
    cfg, b = model.config, model.backend
    cache, prompt, logits = _prefill(model, rng, int(rng.integers(1, 9)))
    pd = PersistentDecode.from_model(model, n_ctx=N_CTX, tile_rows=tile_rows, grid=grid)
    pd.load_cache(cache, len(prompt))
    token, pos = int(np.argmax(logits)), len(prompt)
    for _ in range(STEPS):
        ref = b.to_host(model.transformer.forward_tokens([token], pos, cache))[-1]
        got = pd.step(token, pos)
        assert np.isfinite(got).all()
        bound = logits_bound(cfg, pos, ref)
        err = float(np.abs(got - ref).max())
        assert err <= bound, f"pos {pos}: max |persistent - runner| {err:.3g} > {bound:.3g}"
        assert int(np.argmax(got)) == int(np.argmax(ref))
        for il in range(cfg.n_layer):
            for mine, theirs in ((pd.runner.cache_k, cache.k[il]), (pd.runner.cache_v,
                                                                    cache.v[il])):
                row, want = mine.numpy()[il, :, pos], theirs.numpy()[:, pos]
                scale = max(1.0, float(np.abs(want).max()))
                assert np.abs(row - want).max() <= dot_path_length(cfg, pos) * EPS32 * scale
        token, pos = int(np.argmax(ref)), pos + 1


def test_replayed_launch_gives_the_same_logits(model, rng):
    """The counters reset themselves: the same launch (io unchanged) replayed on activations
    poisoned with NaN gives bit-identical logits, and the counters are zero after each."""
    cache, prompt, _ = _prefill(model, rng, 5)
    pd = PersistentDecode.from_model(model, n_ctx=N_CTX, grid=4)
    pd.load_cache(cache, len(prompt))
    token = int(rng.integers(0, model.config.n_vocab))
    first = pd.step(token, len(prompt))
    assert not pd.runner.counters.numpy().any()
    for _ in range(2):
        pd.runner.acts.fill(np.nan)
        pd.runner.launch()
        np.testing.assert_array_equal(pd.runner.logits(), first)
        assert not pd.runner.counters.numpy().any()


def test_bad_steps_and_unsupported_models_are_refused(model):
    pd = PersistentDecode.from_model(model, n_ctx=N_CTX, grid=2)
    with pytest.raises(ValueError, match=r"position 48 in \[0, 48\)"):
        pd.step(1, N_CTX)
    with pytest.raises(ValueError, match="token 263"):
        pd.step(model.config.n_vocab, 0)
    qwen2 = llm.load(TINY / "tiny-qwen2-f32.gguf", device="cpu", backend="kernels", n_ctx=16,
                     progress=False)
    with pytest.raises(UnsupportedModel, match="biases"):
        PersistentDecode.from_model(qwen2)
    numpy_model = llm.load(TINY / "tiny-llama-f32.gguf", backend="numpy", n_ctx=16,
                           progress=False)
    with pytest.raises(UnsupportedModel, match="backend='kernels'"):
        PersistentDecode.from_model(numpy_model)
