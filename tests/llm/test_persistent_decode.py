"""The persistent decode step in the runner (RunnerOptions.persistent_decode: llm/backends/
persistent_decode.py over stdlib_kernels/persistent/), CPU target: greedy decode of the tiny
golden llama and of tiny synthetic Q4_K_M and Q4_1 files, the same prompt prefilled by the
runner's normal path into its own KV cache (f32, and f16 as on the GPU), each decode step
through the decode graphs and through the persistent launch (captured and replayed as the
graphs are), logits and tokens compared; the refusals.

Why logits are compared to a tolerance, not bit for bit: on the CPU target the decode graph's
matmuls are kernels_extra.matmul_rows (a dequantized weight times a dequantized Q8_1 value per
term, summed in f32), the persistent step's the GPU GEMV's DP4A dots (exact integer sums per
block, then d_w d_x s in f32, and for formats with a min (Q4_1, Q4_K) the activation block's
sum s rounded to f16 in the Q8_1 block, a 2^-11 relative error on that term). The two agree to
f32 rounding except for that term and for the cascade it starts: once an activation differs in
its last bits, the next Q8_1 quantization may round one of its values the other way, a change of
d_x = amax / 127 in one input of a dot (test_batching's GEMV-against-GEMM checks see up to
8e-3 relative L2 from such flips on one-layer random models; 2e-2 here covers two layers).
Greedy tokens must then agree wherever the graph's top two logits are further apart than the
largest logit difference seen, which the check below enforces step by step.
"""
import functools

import numpy as np
import pytest

import llm
from llm.backends.persistent_decode import PersistentDecode, UnsupportedModel
from llm.options import RunnerOptions
from tests.llm.gguf_helpers import TINY

N_CTX = 48
STEPS = 6
REL_L2 = 2e-2


@pytest.fixture(scope="module")
def synth_paths(tmp_path_factory):
    """Tiny synthetic llamas: Q4_K_M (q|k Q4_K and v Q6_K in one qkv matrix: two row groups;
    output Q6_K, tied) and Q4_1 (its output Q8_0: 128 columns are no K-quant)."""
    from llm import synth
    shapes = {"tiny-q4k": synth.Shape("llama", 256, 512, 2, 4, 2, 300, 256, 10000.0, 1e-5,
                                      True, False, "llama-bpe"),
              "tiny-q41": synth.Shape("llama", 128, 256, 2, 4, 1, 300, 256, 10000.0, 1e-5,
                                      False, False, "llama-bpe")}
    out = {}
    with pytest.MonkeyPatch.context() as patch:
        for (name, shape), ftype in zip(shapes.items(), ("Q4_K_M", "Q4_1")):
            patch.setitem(synth.SHAPES, name, shape)
            out[name] = synth.write_synthetic(name, ftype, tmp_path_factory.mktemp(name) /
                                              f"{name}.gguf")
    return out


@functools.cache
def _load(path, persistent: bool, kv: str, gemv: bool = False):
    return llm.load(path, device="cpu", backend="kernels", n_ctx=N_CTX, progress=False,
                    kv_dtype=kv, gemv=gemv, options=RunnerOptions(persistent_decode=persistent))


def _cache(model):
    cfg = model.config
    return model.backend.kv_cache(cfg.n_layer, N_CTX, cfg.n_head_kv, cfg.head_dim,
                                  cfg.head_dim_v)


def _decode_rows(model, prompt, tokens=None):
    """Prefill `prompt` through the runner's prompt path, then STEPS decode_step calls (the
    step's graph captured on its first use, replayed after), fed `tokens` or, without them,
    greedily (the first token the prompt's argmax): (the logits rows, the tokens fed, the
    cache)."""
    cache, gr = _cache(model), model.transformer
    last = model.backend.to_host(gr.forward_tokens(prompt, 0, cache))[-1]
    fed, rows = [], []
    for i in range(STEPS):
        token = tokens[i] if tokens is not None else int(np.argmax(last))
        last = model.backend.to_host(gr.decode_step(token, len(prompt) + i, cache)).reshape(-1)
        fed.append(token)
        rows.append(last)
    return np.array(rows), fed, cache


def _path(name, synth_paths):
    return synth_paths[name] if name in synth_paths else TINY / name


@pytest.mark.parametrize("name,kv", [("tiny-llama-q8_0.gguf", "f32"),
                                     ("tiny-llama-q8_0.gguf", "f16"),
                                     ("tiny-llama-f32.gguf", "f32"),
                                     ("tiny-q4k", "f16"), ("tiny-q41", "f32")])
def test_decode_steps_follow_the_graph_path(rng, seed, synth_paths, name, kv):
    """Greedy steps after a random prompt through the graphs; the same tokens fed to the
    persistent path on its own cache: each step's logits within REL_L2, the same greedy pick
    wherever the graph's top-two margin exceeds twice the largest difference seen so far, and
    the persistent launch really ran (its step attached to that cache)."""
    path = _path(name, synth_paths)
    graph, persistent = _load(path, False, kv), _load(path, True, kv)
    prompt = rng.integers(0, graph.config.n_vocab, int(rng.integers(1, 9))).tolist()
    ref, tokens, _ = _decode_rows(graph, prompt)
    got, _, cache = _decode_rows(persistent, prompt, tokens)
    assert persistent.transformer._persistent.ready(cache) is not None
    assert graph.transformer._persistent.ready(cache) is None
    _assert_follows(got, ref, f"seed {seed}: {name}")


def _assert_follows(got, ref, who: str) -> None:
    """Each step's logits within REL_L2 of the graph's, and the same greedy pick wherever the
    graph's top-two margin exceeds twice the largest difference seen so far."""
    worst = 0.0
    for step, (mine, theirs) in enumerate(zip(got, ref)):
        assert np.isfinite(mine).all(), (who, step)
        err = float(np.linalg.norm(mine - theirs) / np.linalg.norm(theirs))
        assert err < REL_L2, f"{who} step {step}: rel L2 {err:.2e}"
        worst = max(worst, float(np.abs(mine - theirs).max()))
        top2 = np.sort(theirs)[-2:]
        if top2[1] - top2[0] > 2 * worst:
            assert int(np.argmax(mine)) == int(np.argmax(theirs)), (who, step)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tiny-q4k", "tiny-q41"])
def test_gpu_steps_with_split_attention(cuda_device, rng, seed, synth_paths, name):
    """On the GPU: the persistent step (its plan for the co-resident grid: 3 attention splits
    per head at this context, 2 of them used from position 16, with the merge's arrival
    counters, the QUANT items and the L2 prefetch on real hardware) against the decode graphs
    after a 20-token prompt, as test_decode_steps_follow_the_graph_path checks on the CPU."""
    path = synth_paths[name]

    def load(persistent: bool):
        return llm.load(path, device="cuda", backend="kernels", n_ctx=N_CTX, progress=False,
                        kv_dtype="f16", options=RunnerOptions(persistent_decode=persistent))

    graph, persistent = load(False), load(True)
    prompt = rng.integers(0, graph.config.n_vocab, 20).tolist()
    ref, tokens, _ = _decode_rows(graph, prompt)
    got, _, cache = _decode_rows(persistent, prompt, tokens)
    step = persistent.transformer._persistent.ready(cache)
    assert step is not None and step.runner.sched.attn_splits >= 2
    _assert_follows(got, ref, f"seed {seed}: {name} on the GPU")


def test_same_bits_as_the_gpu_decode_graph(synth_paths):
    """With the decode graph's matmuls on stdlib's DP4A GEMV (gemv=True: the GPU's path, not
    the CPU target's default), the prompt prefilled the same way and the steps fed the same
    tokens, the Q4_K_M step's logits are bit for bit the graph's: the same item dots in the
    same per-lane order (decode_rows.py), the same Q8_1 inputs (the norm's sum order
    replayed), and here the attention's rounding happens to agree too. Fixed inputs (a
    different order elsewhere would show as a last-bit difference, which a Q8_1 rounding
    step can amplify: random inputs would make this flaky, not stronger)."""
    path = synth_paths["tiny-q4k"]
    prompt = [3, 141, 59, 26, 5]
    ref, tokens, _ = _decode_rows(_load(path, False, "f32", True), prompt)
    got, _, _ = _decode_rows(_load(path, True, "f32", True), prompt, tokens)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_greedy_tokens_equal_both_ways(rng, seed, kv):
    """N greedy tokens of the golden tiny Q8_0 llama through the runner's device-token loop
    (greedy_tokens: each step's argmax feeds the next on the device) both ways: the same
    tokens."""
    path = TINY / "tiny-llama-q8_0.gguf"
    runs = []
    for persistent in (False, True):
        model = _load(path, persistent, kv)
        cache, gr = _cache(model), model.transformer
        prompt = [1, 17, 42, 99, 5]
        first = int(np.argmax(model.backend.to_host(gr.forward_tokens(prompt, 0, cache))[-1]))
        runs.append([first] + gr.greedy(first, len(prompt), cache, 16))
    assert runs[0] == runs[1], f"graphs {runs[0]}\npersistent {runs[1]}"


def test_unsupported_models_and_caches_are_refused():
    """Refusals by name; with the option on, such a model decodes through its graphs (one
    warning)."""
    qwen2 = llm.load(TINY / "tiny-qwen2-f32.gguf", device="cpu", backend="kernels", n_ctx=16,
                     progress=False, options=RunnerOptions(persistent_decode=True))
    with pytest.raises(UnsupportedModel, match="biases"):
        PersistentDecode.from_model(qwen2)
    cache = _cache(qwen2)
    qwen2.transformer.forward_tokens([1, 2], 0, cache)
    with pytest.warns(RuntimeWarning, match="decoding with the layer graphs"):
        qwen2.transformer.decode_step(3, 2, cache)
    assert qwen2.transformer._persistent.ready(cache) is None
    f32_acts = llm.load(TINY / "tiny-llama-q8_0.gguf", device="cpu", backend="kernels",
                        n_ctx=16, progress=False, activations="f32")
    with pytest.raises(UnsupportedModel, match="f32 activations"):
        PersistentDecode.from_model(f32_acts)
    numpy_model = llm.load(TINY / "tiny-llama-f32.gguf", backend="numpy", n_ctx=16,
                           progress=False)
    with pytest.raises(UnsupportedModel, match="backend='kernels'"):
        PersistentDecode.from_model(numpy_model)
    model = _load(TINY / "tiny-llama-q8_0.gguf", True, "f32")
    pd = PersistentDecode.from_model(model, n_ctx=N_CTX, cache_dtype=np.float16)
    with pytest.raises(UnsupportedModel, match="not one it reads"):
        pd.attach(_cache(model))
    pd = PersistentDecode.from_model(model, n_ctx=N_CTX, cache_dtype=np.float32)
    with pytest.raises(ValueError, match="no KV cache"):
        pd.runner.launch()
    pd.attach(_cache(model))
    with pytest.raises(ValueError, match=r"position 48 in \[0, 48\)"):
        pd.step(1, N_CTX)
    with pytest.raises(ValueError, match="token 263"):
        pd.step(model.config.n_vocab, 0)
