"""Prompts run together (Transformer.forward_prompts, generate.prefill_together, and the batch
scheduler admitting several requests at once): each prompt's last logits, and the cache it
leaves for the next step, equal the same prompt run alone, on the numpy backend and the
kernels backend (CPU target; the GPU's under -m gpu), with prompts of one token, prompts that
reuse a cached prefix, and caches of one pool or apart."""
import numpy as np
import pytest

from llm.batching import BatchScheduler
from llm.generate import GenerationStats, Session, prefill_together
from tests.llm.gguf_helpers import TINY_LLAMA, require_for_module
from tests.llm.test_batching import BACKENDS, d64_path, load, rel_l2  # noqa: F401 (fixture)

require_for_module(TINY_LLAMA)


def tolerance(where, name) -> float:
    # the head_dim-64 model's attention is the tensor-core kernel (Q and P rounded to f16):
    # a 1-token prompt alone takes the decode kernel, together the prefill one (test_batching).
    # The kernels backend's f32 matmuls sum in another order at another token count (a
    # 6-token prompt alone, 23 tokens together): 1.3e-5 on an H200 for seed 10 of 1..12
    if where[1] == "kernels":
        return 2e-2 if name == "tiny-d64" else 1e-4
    return 1e-5


@pytest.mark.parametrize("pool", [False, True], ids=["apart", "pool"])
@pytest.mark.parametrize("name", ["tiny-llama-f32.gguf", "tiny-qwen3-f32.gguf",
                                  "tiny-gpt2-f32.gguf", "tiny-llama-q8_0.gguf", "tiny-d64"])
@pytest.mark.parametrize("where", BACKENDS, ids=lambda w: "-".join(w))
def test_prompts_together_equal_each_alone(where, name, pool, d64_path, rng, seed):
    """Four prompts (1, 6, 13 and 3 new tokens; the last two after 5 and 9 cached tokens of
    their own) in one forward pass: each last-logits row against the prompt prefilled alone,
    then one step of each session (reading what the batched pass wrote into its cache)
    against the step alone."""
    model = load(*where, name=d64_path if name == "tiny-d64" else name, n_ctx=64)
    cfg, n_vocab = model.config, model.config.n_vocab
    tol = tolerance(where, name)
    cached = [[], [], rng.integers(0, n_vocab, 5).tolist(), rng.integers(0, n_vocab, 9).tolist()]
    prompts = [c + rng.integers(0, n_vocab, n).tolist() for c, n in zip(cached, (1, 6, 13, 3))]
    nxt = rng.integers(0, n_vocab, len(prompts))
    caches = [None] * len(prompts) if not pool else model.backend.kv_caches(
        len(prompts), cfg.n_layer, 32, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v)
    alone, sessions = [], []
    for c, prompt, token, cache in zip(cached, prompts, nxt, caches):
        reference = Session(model.transformer, model.backend, 32)
        session = Session(model.transformer, model.backend, 32, cache=cache)
        for s in (reference, session):
            if c:
                s.prefill(c)
        alone.append((reference.prefill(prompt)[0], reference.step(int(token))))
        sessions.append(session)
    rows, computed = prefill_together(sessions, prompts)
    assert rows.shape == (len(prompts), n_vocab)
    assert computed == [1, 6, 13, 3]
    for i, (session, token) in enumerate(zip(sessions, nxt)):
        assert session.tokens == prompts[i]
        err = rel_l2(rows[i], alone[i][0])
        assert err < tol, f"seed {seed}: prompt {i}'s logits: relative L2 {err:.2e}"
        err = rel_l2(session.step(int(token)), alone[i][1])
        assert err < tol, f"seed {seed}: prompt {i}'s next step: relative L2 {err:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_tensor_core_prompt_paths_on_the_cpu_target(d64_path, kv, monkeypatch):
    """The GPU's prompt paths, forced on the CPU target (its mma emulated exactly): on the
    fused q|k|v columns in place, one RoPE + K/V launch and one launch_prefill_seqs per layer
    for the slots of one f16 pool, two launches per prompt for caches apart or a q8_0 pool;
    every prompt's logits equal to the prompt prefilled alone on that path, bit for bit."""
    import sys
    from llm.backends import kernels_attention
    from tests.launch_helpers import launched_by
    prefill = sys.modules["stdlib_kernels.attention.prefill"]
    monkeypatch.setattr(kernels_attention.KernelsAttention, "_tensor_core_prefill",
                        lambda self, k_cache: True)
    monkeypatch.setattr(prefill, "default_path", lambda k_cache, device=None: "mma")
    model = load("cpu", "kernels", name=d64_path, n_ctx=64, kv_dtype=kv, graphs=False)
    cfg, rng = model.config, np.random.default_rng(0)
    prompts = [rng.integers(0, cfg.n_vocab, n).tolist() for n in (1, 6, 13, 3)]
    alone = [Session(model.transformer, model.backend, 32).prefill(p)[0] for p in prompts]
    for pool in (False, True):
        caches = [None] * 4 if not pool else model.backend.kv_caches(
            4, cfg.n_layer, 32, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v)
        sessions = [Session(model.transformer, model.backend, 32, cache=c) for c in caches]
        rows = []
        names = launched_by(lambda: rows.append(prefill_together(sessions, prompts)[0]))
        one_launch = pool and kv == "f16"
        assert names.count("prefill_flash") == cfg.n_layer * (1 if one_launch else 4), names
        assert names.count("rope_qkv_cache") == names.count("prefill_flash")
        for i, row in enumerate(rows[0]):
            np.testing.assert_array_equal(row, alone[i], err_msg=f"{kv} pool {pool} prompt {i}")


def test_forward_prompts_checks_its_lists():
    model = load("cpu", "numpy", n_ctx=32)
    session = Session(model.transformer, model.backend, 16)
    with pytest.raises(ValueError, match="one each"):
        model.transformer.forward_prompts([[1, 2]], [0, 0], [session.cache])
    with pytest.raises(ValueError, match="none empty"):
        model.transformer.forward_prompts([[]], [0], [session.cache])
    with pytest.raises(ValueError, match="empty prompt"):
        prefill_together([session], [[]])


@pytest.mark.parametrize("where", BACKENDS, ids=lambda w: "-".join(w))
def test_scheduler_runs_the_prompts_it_admits_together(where, d64_path):
    """Four requests admitted at once on four slots: their prompts run in one forward pass
    (a fifth, echoing its prompt's log-probabilities, alone after them), and every greedy
    text equals the prompt's generation alone."""
    model = load(*where, name=d64_path, n_ctx=5 * 48)
    prompts = [[5, 9, 13], [7], [11, 3, 8, 1, 2, 30, 31], [4, 4, 4, 4, 4], [6, 2, 9]]
    max_tokens = [4, 6, 1, 5, 3]
    expected = ["".join(model.generate(p, max_tokens=m, temperature=0))
                for p, m in zip(prompts, max_tokens)]
    calls = []
    together = model.transformer.forward_prompts

    def counted(batch, starts, caches):
        calls.append([len(p) for p in batch])
        return together(batch, starts, caches)
    model.transformer.forward_prompts = counted
    scheduler = BatchScheduler(model, slots=5)
    try:
        stats = [GenerationStats() for _ in prompts]
        with scheduler._wake:                 # all admitted in one round
            streams = [scheduler.generate(p, max_tokens=m, temperature=0, stats=s,
                                          logprobs=0 if i == 4 else None,
                                          prompt_logprobs=i == 4)
                       for i, (p, m, s) in enumerate(zip(prompts, max_tokens, stats))]
        got = ["".join(s) for s in streams]
    finally:
        scheduler.close()
        del model.transformer.forward_prompts
    assert got == expected
    assert calls == [[3, 1, 7, 5]], calls
    assert [s.prompt_tokens for s in stats] == [len(p) for p in prompts]
    counters = scheduler.metrics.snapshot()
    assert counters["prompt_tokens_total"] == sum(map(len, prompts))
    assert counters["prompt_passes_total"] == 2


@pytest.mark.parametrize("where", BACKENDS, ids=lambda w: "-".join(w))
def test_running_requests_step_inside_prompt_passes(where):
    """Four requests admitted while a fifth is decoding: the running one's next token rides in
    their prompt pass (a one-token prompt over its own slot) instead of waiting for it; every
    greedy text equals the prompt's generation alone. On the f32 tiny llama, whose attention
    is the same kernel for a decode step and a prompt (head_dim 16): with the tensor-core
    kernels (head_dim 64) a rider's logits come from the prefill kernel, which differs from
    the decode kernel by f16 roundings (test_prompts_together_equal_each_alone bounds it) and
    flipped a greedy pick of a random model on an H200."""
    model = load(*where, n_ctx=5 * 64)
    prompts = [[5, 9, 13, 2], [7, 1], [11, 3, 8], [4, 4, 4], [30, 31]]
    max_tokens = [24, 5, 6, 3, 7]
    expected = ["".join(model.generate(p, max_tokens=m, temperature=0))
                for p, m in zip(prompts, max_tokens)]
    scheduler = BatchScheduler(model, slots=5)
    start, rest = scheduler._start, []

    def start_then_queue(group, riders=()):
        start(group, riders)
        if not rest:           # the first request has its first token: queue the others
            rest.extend(scheduler.generate(p, max_tokens=m, temperature=0)
                        for p, m in zip(prompts[1:], max_tokens[1:]))
    scheduler._start = start_then_queue
    try:
        first = scheduler.generate(prompts[0], max_tokens=max_tokens[0], temperature=0)
        got = ["".join(first)] + ["".join(s) for s in rest]
    finally:
        scheduler.close()
    assert got == expected
    counters = scheduler.metrics.snapshot()
    assert counters["prompt_pass_decode_rows_total"] == 1, counters
    assert counters["prompt_passes_total"] == 2


def test_fewer_prompts_than_min_together_run_one_by_one(monkeypatch):
    """Admitted prompts fewer than the transformer's min_prompts_together (the kernels
    backend's graphs: MIN_PROMPTS_TOGETHER) run one by one, not in an eager pass."""
    model = load("cpu", "numpy", n_ctx=4 * 64)
    monkeypatch.setattr(type(model.transformer), "min_prompts_together", 3, raising=False)
    calls = []
    together = model.transformer.forward_prompts
    model.transformer.forward_prompts = lambda *args: calls.append(args) or together(*args)
    scheduler = BatchScheduler(model, slots=4)
    try:
        for batch in ([[5, 9], [7, 1, 2]], [[3], [4, 4], [6, 2, 1]]):
            with scheduler._wake:
                streams = [scheduler.generate(p, max_tokens=2, temperature=0) for p in batch]
            [("".join(s)) for s in streams]
    finally:
        scheduler.close()
        del model.transformer.forward_prompts
    assert [len(args[0]) for args in calls] == [3]           # the pair ran one by one
    assert scheduler.metrics.snapshot()["prompt_passes_total"] == 3


def test_prompt_groups_fit_one_prefill_step(monkeypatch):
    """The scheduler's groups: consecutive prompts while their new tokens fit one prefill
    step (after what each slot reuses); a longer prompt and a scored one alone."""
    import llm.batching as batching
    from llm.batch_slots import prompt_groups
    model = load("cpu", "numpy", n_ctx=8 * 64)
    monkeypatch.setattr(batching, "prefill_step_tokens", lambda transformer, options: 16)
    scheduler = BatchScheduler(model, slots=8)
    try:
        scheduler.sessions[2].tokens = [1] * 10          # a cached prefix of request 2's
        lengths = [6, 9, 12, 20, 3, 3, 4, 4]
        requests = [batching._Request([1] * n, None, slot=i, prompt_logprobs=i == 5)
                    for i, n in enumerate(lengths)]
        groups = prompt_groups(scheduler.sessions, requests, scheduler._step_tokens)
    finally:
        scheduler.close()
    # 6 + 9 fit; 12 reuses 10 (2 new, over 15 + 2); 20 alone; 3; the scored one alone; 4 + 4
    assert [[r.slot for r in g] for g, _ in groups] == [[0, 1], [2], [3], [4], [5], [6, 7]]
    assert [n for _, n in groups] == [15, 2, 17, 3, 17, 8]      # alone: over the step


@pytest.fixture(scope="module")
def k256_path(tmp_path_factory):
    """A one-layer synthetic llama (Q4_K_M) whose matmuls all take the super-block int8 GEMM
    (K = 256 and 512) with its tile classes."""
    from llm import synth
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(synth.SHAPES, "tiny-k256", synth.Shape(
            "llama", 256, 512, 1, 4, 1, 512, 512, 10000.0, 1e-5, False, False, "llama-bpe"))
        return synth.write_synthetic("tiny-k256", "Q4_K_M",
                                     tmp_path_factory.mktemp("k256") / "tiny-k256.gguf")


@pytest.mark.gpu
def test_precompiled_lengths_cover_every_prompt_length(k256_path):
    """The kernels a server's warm-up compiles (precompile_lengths' passes) are every kernel
    specialization a prompt pass of any length up to one step launches: recorded, not run,
    passes of each length 1..384 (four caches of 96: the 65-256 token tile classes and the
    128-row tiles after them) against those of the precompiled lengths."""
    from llm.backends.kernels_graph import precompile_lengths
    from pykernel.compile_pool import recorded_launches
    model = load("cuda", "kernels", name=k256_path, n_ctx=4 * 96)
    cfg, most = model.config, 4 * 96
    caches = model.backend.kv_caches(4, cfg.n_layer, 96, cfg.n_head_kv, cfg.head_dim,
                                     cfg.head_dim_v)

    def specs(lengths) -> set:
        with recorded_launches() as recorded:
            model.transformer.record_prompts(caches, lengths)
        return {(kernel.name, repr(sorted(spec.items()))) for kernel, _, spec, _ in recorded}
    every = specs(range(1, most + 1))
    assert any(name == "gemm_q8k_kernel" for name, _ in every), sorted(every)
    assert specs(precompile_lengths(most)) == every
