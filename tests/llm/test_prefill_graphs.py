"""Short prompts through captured graphs (kernels_graph.prefill_step): prompts padded to a
length bucket give the logits of the eager prefill, whatever their length inside the bucket
and their start; the bucket is eager the first time, captured the second, replayed after;
decode steps after a graph prefill read the rows it wrote, not its padding. On the CPU target
(tiny models) and on the GPU (plus a head_dim-64 model, whose prefill runs the tensor-core
flash attention with its start read from the device)."""
from types import SimpleNamespace

import numpy as np
import pytest

import llm
from dataclasses import replace
from llm.options import RunnerOptions
from llm.backends import kernels_graph
from llm.backends.kernels_graph import prefill_bucket
from pykernel.runtime import device as dv
from tests.llm.gguf_helpers import TINY, require_for_module

DEFAULT = RunnerOptions()

require_for_module(TINY / "tiny-logits.json")

# prompt chunks fed one after another: buckets 5 (eager, captured, replayed), 3 (eager),
# 16 (12, 10, 9 tokens: eager, captured, replayed)
LENGTHS = (5, 5, 5, 3, 12, 10, 9)
N_CTX = 64


def rel_l2(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_prefill_buckets():
    assert [prefill_bucket(n) for n in (2, 3, 4, 5, 8, 9, 16, 17, 63, 64)] == \
        [2, 3, 4, 5, 8, 16, 16, 24, 64, 64]


def _chunk_logits(model, ids, monkeypatch, graphs: bool, lengths=LENGTHS, n_ctx=N_CTX):
    """Last-row logits after each chunk of `lengths`, then after one decode step; the cache."""
    cfg, t, b = model.config, model.transformer, model.backend
    monkeypatch.setattr(b, "options", replace(b.options, prefill_graphs=graphs))
    cache = b.kv_cache(cfg.n_layer, n_ctx, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v)
    out, pos = [], 0
    for n in lengths:
        chunk = np.asarray(ids[pos:pos + n], np.int64)
        out.append(b.to_host(t.forward_tokens(chunk, pos, cache))[-1])
        pos += n
    out.append(b.to_host(t.forward_tokens(np.asarray(ids[pos:pos + 1], np.int64), pos, cache))[-1])
    return out, cache


def _check(model, rng, seed, monkeypatch, tol, lengths=LENGTHS, n_ctx=N_CTX):
    ids = [int(i) for i in rng.integers(0, model.config.n_vocab, sum(lengths) + 1)]
    eager, _ = _chunk_logits(model, ids, monkeypatch, False, lengths, n_ctx)
    graphed, cache = _chunk_logits(model, ids, monkeypatch, True, lengths, n_ctx)
    for i, (got, want) in enumerate(zip(graphed, eager)):
        what = f"chunk {i} ({lengths[i]} tokens)" if i < len(lengths) else "decode step"
        assert np.isfinite(got).all() and rel_l2(got, want) < tol, \
            f"{what}: relative L2 {rel_l2(got, want):.2e} vs the eager prefill (seed {seed})"
    if lengths != LENGTHS:        # one bucket, three times: eager, captured, replayed
        assert [(b, s.graph is not None) for b, s in cache.prefill_graphs.items()] == \
            [(prefill_bucket(lengths[0]), True)]
        return
    assert sorted(cache.prefill_graphs) == [3, 5, 16]
    assert cache.prefill_graphs[5].graph is not None and cache.prefill_graphs[16].graph is not None
    assert cache.prefill_graphs[3].graph is None          # seen once: run eagerly, not captured


@pytest.mark.parametrize("name", ["tiny-qwen2-f32.gguf", "tiny-gpt2-f32.gguf",
                                  "tiny-llama-q8_0.gguf"])
def test_prefill_graphs_follow_the_eager_prefill(name, rng, seed, monkeypatch):
    model = llm.load(TINY / name, device="cpu", backend="kernels", n_ctx=N_CTX, progress=False)
    _check(model, rng, seed, monkeypatch, 1e-5)


def test_prefill_graphs_stay_out_of_their_limits(rng, monkeypatch):
    """Eager: a prompt over options.prefill_graph_max, one whose bucket would run past the
    context, a
    q8_0 cache (its prefill dequantizes a host-sized row count) and all_logits."""
    model = llm.load(TINY / "tiny-qwen2-f32.gguf", device="cpu", backend="kernels",
                     n_ctx=N_CTX, progress=False)
    cfg, t = model.config, model.transformer
    cache = model.backend.kv_cache(cfg.n_layer, N_CTX, cfg.n_head_kv, cfg.head_dim,
                                   cfg.head_dim_v)
    assert not t._prefill_graphable(DEFAULT.prefill_graph_max + 1, 0, cache)
    assert not t._prefill_graphable(9, N_CTX - 15, cache)        # bucket 16 from 49: past 64
    assert t._prefill_graphable(9, N_CTX - 16, cache)
    # (the tiny models' head_dim 16 cannot hold a q8_0 cache: a stand-in with its two fields)
    assert not t._prefill_graphable(5, 0, SimpleNamespace(q8=True, n_ctx=N_CTX))
    t.forward_tokens(np.arange(5, dtype=np.int64), 0, cache, all_logits=True)
    assert not cache.prefill_graphs


@pytest.mark.gpu
def test_gpu_long_prompt_steps_replay_one_graph(rng, seed, monkeypatch, tmp_path):
    """Steps of a long prompt (600 tokens, three times: bucket 600 eager, captured, replayed;
    the default step is 1024 tokens) give the eager prefill's logits; a synthetic SmolLM2 in
    Q4_1 (the int8 per-block GEMM, its inputs 576 wide)."""
    if not dv.gpu_available():
        pytest.skip("no usable CUDA GPU (driver missing or no device)")
    from llm.synth import write_synthetic
    path = write_synthetic("smollm2-135m", "Q4_1", tmp_path / "smol.gguf")
    model = llm.load(path, device="cuda", n_ctx=2048, progress=False)
    assert model.transformer.prefill_step_tokens == DEFAULT.prefill_graph_max >= 600
    _check(model, rng, seed, monkeypatch, 1e-3, lengths=(600, 600, 600), n_ctx=2048)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tiny-qwen2-f32.gguf", "tiny-llama-q8_0.gguf", "smollm2"])
def test_gpu_prefill_graphs_follow_the_eager_prefill(name, rng, seed, monkeypatch, tmp_path):
    if not dv.gpu_available():
        pytest.skip("no usable CUDA GPU (driver missing or no device)")
    path = TINY / name
    if name == "smollm2":        # head_dim 64: the tensor-core prefill, start on the device
        from llm.synth import write_synthetic
        path = write_synthetic("smollm2-135m", "Q4_0", tmp_path / "smol.gguf")
    model = llm.load(path, device="cuda", n_ctx=N_CTX, progress=False)
    _check(model, rng, seed, monkeypatch, 1e-3)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_prompt_graphs_serve_every_slot_of_a_pool(device, rng, seed, monkeypatch):
    """A server's slots share one KV pool: a bucket runs eagerly once, is captured once (on
    the slot that prompts second) and replays on every slot, re-pointed at it (graph_slots).
    Each prompt's logits, and each slot's next decode step after all the prompts (so no
    prompt wrote into another slot), equal that prompt's eager prefill in a cache alone."""
    if device == "cuda" and not dv.gpu_available():
        pytest.skip("no usable CUDA GPU (driver missing or no device)")
    model = llm.load(TINY / "tiny-qwen2-f32.gguf", device=device, backend="kernels",
                     n_ctx=N_CTX, progress=False)
    cfg, t, b = model.config, model.transformer, model.backend
    tol = 1e-5 if device == "cpu" else 1e-4

    def run(ids, cache, start=0):
        return b.to_host(t.forward_tokens(np.asarray(ids, np.int64), start, cache))[-1]

    order = [0, 1, 2, 1, 0, 2]                # bucket 5 on slots in this order
    prompts = [[int(i) for i in rng.integers(0, cfg.n_vocab, 5)] for _ in order]
    nxt = [int(i) for i in rng.integers(0, cfg.n_vocab, 3)]
    monkeypatch.setattr(b, "options", replace(b.options, prefill_graphs=False))
    alone = []
    for ids in prompts:
        cache = b.kv_cache(cfg.n_layer, N_CTX, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v)
        alone.append((run(ids, cache), cache))
    last = {slot: i for i, slot in enumerate(order)}       # the prompt each slot holds at the end
    want_next = {slot: run([nxt[slot]], alone[i][1], 5) for slot, i in last.items()}
    monkeypatch.setattr(b, "options", replace(b.options, prefill_graphs=True))
    caches = b.kv_caches(3, cfg.n_layer, N_CTX, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v)
    for i, (slot, ids) in enumerate(zip(order, prompts)):
        got = run(ids, caches[slot])
        assert rel_l2(got, alone[i][0]) < tol, f"prompt {i} on slot {slot} (seed {seed})"
    for slot, want in want_next.items():
        got = run([nxt[slot]], caches[slot], 5)
        assert rel_l2(got, want) < tol, f"slot {slot}'s next step (seed {seed})"
    step = caches[0].pool.prefill_graphs[5]
    assert list(caches[0].pool.prefill_graphs) == [5] and step.graph is not None
    assert step.binding is not None and step.binding.cache is caches[2]
    assert all(not c.own_prefill_graphs and c.prefill_graphs == {5: step} for c in caches)


def test_prompt_steps_shrink_to_the_free_device_memory(monkeypatch):
    """The prompt step (prefill_step_tokens) halves from options.prefill_graph_max until the
    bound of
    its activations fits in half of the free device memory, measured once a KV cache exists
    and kept; the CPU target (no free-memory figure) keeps it. The bound holds
    the H100 measurements it names."""
    model = llm.load(TINY / "tiny-qwen2-f32.gguf", device="cpu", backend="kernels",
                     n_ctx=N_CTX, progress=False)
    t, memory = model.transformer, model.backend.memory
    assert t.prefill_step_tokens == DEFAULT.prefill_graph_max
    bound = kernels_graph.prefill_activation_bound
    eight_b = SimpleNamespace(n_embd=4096, n_ff=14336)
    assert bound(eight_b, 1024) >= 939 * 2 ** 20           # measured after steps up to 1024
    assert bound(SimpleNamespace(n_embd=1536, n_ff=8960), 1024) >= 489 * 2 ** 20
    assert bound(SimpleNamespace(n_embd=576, n_ff=1536), 1024) >= 115 * 2 ** 20
    step = DEFAULT.prefill_graph_max
    free = 2 * bound(t.cfg, step // 4)                  # room for a quarter of the step
    monkeypatch.setattr(memory, "free_bytes", lambda: free)
    assert t.prefill_step_tokens == step // 4
    assert t._fitted_step is None                          # no KV cache yet: not kept
    monkeypatch.setattr(memory, "kv_bytes", 1)
    monkeypatch.setattr(memory, "free_bytes", lambda: 0)   # nothing fits: the smallest step
    assert t.prefill_step_tokens == kernels_graph.SMALLEST_STEP
    monkeypatch.setattr(memory, "free_bytes", lambda: 1 << 50)
    assert t.prefill_step_tokens == kernels_graph.SMALLEST_STEP   # kept once a cache exists
    assert t._prefill_graphable(kernels_graph.SMALLEST_STEP, 0, SimpleNamespace(q8=False,
                                                                                n_ctx=N_CTX))
    assert not t._prefill_graphable(kernels_graph.SMALLEST_STEP + 1, 0,
                                    SimpleNamespace(q8=False, n_ctx=N_CTX))
