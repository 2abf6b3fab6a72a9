"""The kernels backend on the CPU target: llama.cpp's logits for the tiny models, agreement with
the numpy backend, graph-replayed decode equal to prefill; `pykernel synth` files read back by
gguf-py; the `pykernel bench` table format."""
import json
import re

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType as Q

import llm
from dataclasses import replace
from llm.options import RunnerOptions
from stdlib_kernels.options import KernelOptions
from llm.bench import BenchResult, bench, run_bench, table
from llm.synth import SHAPES, tensor_plan, write_synthetic
from tests.llm.gguf_helpers import TINY, require_for_module

require_for_module(TINY / "tiny-logits.json")
CASES = json.loads((TINY / "tiny-logits.json").read_text())
F32_TOL = 1e-3      # measured ~1e-6 (llama, qwen2, qwen3), ~3e-4 (gpt2: ggml's f16 GELU table)
Q8_0_TOL = 2e-2     # measured ~2.5e-7: Q8_1 activations hold the values llama.cpp's Q8_0 ones do
NUMPY_TOL = 1e-5    # f32 models: same arithmetic up to summation order


def rel_l2(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def models():
    return {name: llm.load(TINY / name, device="cpu", backend="kernels", n_ctx=64,
                           progress=False) for name in CASES}


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_match_llama_cpp_and_numpy(models, name):
    model = models[name]
    reference = llm.load(TINY / name, device="cpu", backend="numpy", n_ctx=64, progress=False)
    tol = Q8_0_TOL if "q8_0" in name else F32_TOL
    for case in CASES[name]:
        logits = model.logits(case["tokens"])
        err = rel_l2(logits, np.asarray(case["logits"], np.float32))
        assert err < tol, f"{name} {case['text']!r}: relative L2 vs llama.cpp {err:.2e}"
        if "q8_0" not in name:   # the numpy backend keeps f32 activations there
            numpy_err = rel_l2(logits, reference.logits(case["tokens"]))
            assert numpy_err < NUMPY_TOL, f"{name}: vs numpy backend {numpy_err:.2e}"


@pytest.mark.parametrize("name", ["tiny-llama-q8_0.gguf", "tiny-gpt2-f32.gguf",
                                  "tiny-qwen3-f32.gguf"])
def test_graph_decode_equals_prefill(models, name):
    """Token by token through the captured decode step gives the prefill's logits."""
    model = models[name]
    ids = CASES[name][1]["tokens"]
    full = model.logits(ids)
    session = model.session()
    session.reset()
    steps = [session.prefill(ids[:2])[0]] + [session.step(t) for t in ids[2:]]
    assert model.session().cache.graph is not None, "decode did not use a captured graph"
    assert rel_l2(np.stack(steps), full[1:]) < 1e-5


@pytest.mark.parametrize("vocab", [1, 1000, 49153])
def test_argmax_rows_equal_numpy(models, rng, seed, vocab):
    """Backend.argmax_rows on the kernels backend (the device's argmax; a batched step's
    greedy tokens): numpy's argmax on random rows with ties (the lowest index wins); a NaN
    beside numbers is never chosen; an all-NaN row is NonFiniteLogitsError (a broken model),
    not a token."""
    import pykernel as pk
    backend = models["tiny-llama-f32.gguf"].backend
    x = rng.integers(-50, 50, (5, vocab)).astype(np.float32)     # many ties
    expected = np.argmax(x, axis=1)
    if vocab > 1:
        x[4, 0] = np.nan
        expected[4] = 1 + np.argmax(x[4, 1:])
    got = backend.argmax_rows(pk.to_device(x))
    assert got.tolist() == expected.tolist(), f"seed {seed}"
    assert backend.argmax_rows(pk.to_device(x[1:2])).tolist() == [expected[1]]
    x[3] = np.nan
    with pytest.raises(llm.NonFiniteLogitsError, match="1 of 5 rows"):
        backend.argmax_rows(pk.to_device(x))


def test_logits_rows_pick_a_steps_rows_into_a_buffer_of_their_own(models, rng, seed):
    """Backend.logits_rows on the kernels backend: the chosen rows in the order asked, in a
    buffer that is not the step's activation arena (a later pick of fewer rows reuses it)."""
    import pykernel as pk
    backend = models["tiny-llama-f32.gguf"].backend
    x = rng.standard_normal((6, 3001)).astype(np.float32)
    device_x = pk.to_device(x)
    for indices in ([4, 0, 5], [2]):
        got = backend.logits_rows(device_x, indices)
        assert np.array_equal(got.numpy(), x[indices]), f"seed {seed}"
    assert np.array_equal(device_x.numpy(), x)


def test_top_candidates_list_each_rows_largest(models, rng, seed):
    """Backend.top_candidates on the kernels backend: per row its k largest logits (with the
    ids they sit at) among a short list, twice over the same buffers; a row flat at the top
    (more logits in the k-th's bin than the lists hold) gives None."""
    import pykernel as pk
    from llm.backends.logits_readback import CANDIDATES_CAP
    backend = models["tiny-llama-f32.gguf"].backend
    for rows in (3, 1):
        x = (rng.standard_normal((rows, 5000)) * 3).astype(np.float32)
        if rows == 3:
            x[1, :CANDIDATES_CAP + 10] = 20.0
        lists = backend.top_candidates(pk.to_device(x), 40)
        for r, got in enumerate(lists):
            if rows == 3 and r == 1:
                assert got is None
                continue
            values, ids = got
            assert np.array_equal(values, x[r, ids]), f"seed {seed}"
            assert set(np.argsort(-x[r])[:40].tolist()) <= set(ids.tolist()), f"seed {seed}"
            assert len(ids) < 400


def test_sample_rows_draw_each_row_on_the_device(models, rng, seed):
    """Backend.sample_rows on the kernels backend: a greedy sampler's row gives its argmax
    (the lowest index on ties); a top-k sampler's the token stdlib's one-row sampler draws
    with the uniform its generator gave, which advanced by exactly that one draw, after the
    row's penalties over its window of the history where it has them (stdlib's one-row
    penalties first); twice over the same buffers, the second time for a single row."""
    import copy
    import pykernel as pk
    from llm.sampling import Sampler, SamplingParams, penalty_window
    from stdlib_kernels.sampling import apply_penalties, sample
    backend = models["tiny-llama-f32.gguf"].backend
    params = [SamplingParams(temperature=0), SamplingParams(top_k=40),
              SamplingParams(temperature=1.4, top_k=7, top_p=0.8, min_p=0.0,
                             repeat_penalty=1.3, presence_penalty=40.0, repeat_last_n=12),
              SamplingParams(temperature=0.5, top_k=200, top_p=1.0, min_p=0.2,
                             frequency_penalty=30.0, repeat_last_n=-1)]
    for rows in (4, 1):
        x = (rng.standard_normal((rows, 3001)) * 3).astype(np.float32)
        x[0, [5, 900]] = x.max() + 1.0                    # ties: the lowest index
        samplers = [Sampler(p) for p in params[-rows:]]
        # windows holding each row's 8 largest logits, which the penalties take out of reach
        histories = [np.argsort(-x[r])[:8].tolist() + rng.integers(0, 60, 4).tolist()
                     for r in range(rows)]
        before = [copy.deepcopy(s.rng) for s in samplers]
        got = backend.sample_rows(pk.to_device(x), samplers, histories)
        for r, (s, old, history) in enumerate(zip(samplers, before, histories)):
            p = s.params
            if p.temperature <= 0:
                assert got[r] == 5 and s.rng.random() == old.random(), f"seed {seed}"
                continue
            row = pk.to_device(x[r])
            window = penalty_window(history, p)
            if window:
                apply_penalties(row, np.array(window, np.int32), repeat=p.repeat_penalty,
                                presence=p.presence_penalty, frequency=p.frequency_penalty)
            alone = sample(row, np.float32(old.random()), temperature=p.temperature,
                           top_k=p.top_k, top_p=p.top_p, min_p=p.min_p).numpy()[0]
            assert got[r] == alone, f"seed {seed} row {r}"
            assert not window or got[r] not in window, f"seed {seed} row {r}"
            assert s.rng.random() == old.random(), f"seed {seed}: one draw per row"


@pytest.mark.parametrize("limit", ["max_tokens", "stop", "context", "consumer"])
def test_greedy_stream_pipelined_on_the_device_equals_step_by_step(models, monkeypatch, limit):
    """A greedy generate on the graphed kernels backend takes its tokens from greedy_tokens
    (the device's argmax feeding the next step, one step queued ahead), never from
    step-by-step sampling, and gives the same text, stats and cached ids as stepping token
    by token; for every way a generation ends (max_tokens, a stop string, a full context, a
    consumer that stops reading)."""
    from llm.backends.kernels_graph import GraphRunner
    from llm.generate import GenerationStats
    model = models["tiny-llama-f32.gguf"]
    ids = CASES["tiny-llama-f32.gguf"][0]["tokens"][:5]
    plain = "".join(model.generate(ids, max_tokens=24, temperature=0))
    options = dict(max_tokens=24, temperature=0)
    if limit == "stop":
        options["stop"] = [plain[8:11]]
    n_ctx = model.session().n_ctx

    def run():
        stats, session = GenerationStats(), model.session()
        session.reset()
        if limit == "context":
            session.n_ctx = len(ids) + 7
        pieces = model.generate(ids, stats=stats, **options)
        text = "".join(p for _, p in zip(range(3), pieces)) if limit == "consumer" else \
            "".join(pieces)
        if limit == "consumer":
            pieces.close()
        kept = list(session.tokens)
        session.n_ctx = n_ctx
        return text, (stats.generated_tokens, stats.decode_steps, stats.stop_reason), kept

    calls = []
    greedy_tokens = GraphRunner.greedy_tokens

    def spy(self, *args):
        calls.append(args[1:])
        return greedy_tokens(self, *args)
    monkeypatch.setattr(GraphRunner, "greedy_tokens", spy)
    pipelined = run()
    assert len(calls) == 1
    monkeypatch.setattr(GraphRunner, "greedy_tokens", lambda self, *args: None)  # host
    assert pipelined == run()
    assert pipelined[0] and (limit != "context" or pipelined[1][2] == "context"), pipelined


def sampled_on_device_vs_stepped(model, ids, n, uniforms_seed):
    """(tokens of an unseeded sampled stream, which draws on the device with uniforms from
    the sampler's generator, and the tokens of stepping one token at a time with stdlib's
    sampler and the same uniforms)."""
    from llm.generate import GenerationStats, Session, stream
    from llm.sampling import Sampler, SamplingParams
    from stdlib_kernels.sampling import sample
    params = dict(temperature=0.9, top_k=20, top_p=0.9, min_p=0.02)
    session = model.session()
    session.reset()
    sampler = Sampler(SamplingParams(**params))
    sampler.rng = np.random.default_rng(uniforms_seed)
    stats = GenerationStats()
    list(stream(session, model.tokenizer, ids, sampler, n, stats=stats))
    got = list(session.tokens[len(ids):])
    twin = Sampler(SamplingParams(**params))
    twin.rng = np.random.default_rng(uniforms_seed)
    alone = Session(model.transformer, model.backend, session.n_ctx)
    logits, _ = alone.prefill_act(ids)
    token = model.backend.sample(logits, twin, ids)       # the first token: on the host
    uniforms = twin.rng.random(n)
    expected = []
    for k in range(len(got)):
        expected.append(token)
        row = model.backend.materialize(alone.step_act(token)).reshape(-1)
        token = int(sample(row, float(uniforms[k]), **params).numpy()[0])
    return got, expected, stats


def test_unseeded_sampling_draws_on_the_device(models, monkeypatch):
    """An unseeded sampled generate on the graphed kernels backend draws each token on the
    device (sampled_tokens: stdlib's sampler in the decode graph, one uniform per position)
    with the tokens of stepping one at a time with stdlib's sampler and the same uniforms; a
    seeded one samples on the host (a seed gives the host's draws on every backend)."""
    from llm.backends.kernels_graph import GraphRunner
    model = models["tiny-llama-f32.gguf"]
    ids = CASES["tiny-llama-f32.gguf"][0]["tokens"][:5]
    calls = []
    sampled_tokens = GraphRunner.sampled_tokens

    def spy(self, *args):
        calls.append(args[1])
        return sampled_tokens(self, *args)
    monkeypatch.setattr(GraphRunner, "sampled_tokens", spy)
    for seed in (1, 2, 3):
        got, expected, stats = sampled_on_device_vs_stepped(model, ids, 16, seed)
        assert got == expected and len(got) >= 1, (seed, got, expected)
    assert len(calls) == 3
    "".join(model.generate(ids, max_tokens=8, temperature=0.9, seed=4))
    assert len(calls) == 3                               # seeded: not on the device


@pytest.mark.parametrize("short_context", [256, 3])
def test_greedy_on_device_matches_host_argmax(models, monkeypatch, short_context):
    """short_context 3: the greedy run crosses from the short-context graph to the split one."""
    model = models["tiny-qwen2-f32.gguf"]
    monkeypatch.setattr(model.backend, "options",
                        replace(model.backend.options, short_context=short_context))
    cfg = model.config
    ids = CASES["tiny-qwen2-f32.gguf"][0]["tokens"]
    cache = model.backend.kv_cache(cfg.n_layer, 32, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v)
    picked = model.transformer.greedy(ids[0], 0, cache, 6)
    assert len(cache.graphs) == (2 if short_context < 6 else 1)
    expected, context = [], [ids[0]]
    for _ in range(6):   # host reference: prefill the context, argmax of the last row
        expected.append(int(np.argmax(model.logits(context)[-1])))
        context.append(expected[-1])
    assert picked == expected


def test_decode_graph_fusions_on_gemv_path():
    """The GPU's decode graph (GEMV path) on the CPU target: qwen2's q/k/v bias sits in the
    GEMV epilogue, every RMSNorm feeding a Q8_1 GEMV is fused with its quantization, and
    qwen3's per-head q / k norms run inside the RoPE + KV-cache launch; the step still gives
    the numpy backend's logits."""
    counts = {}
    for name in ("tiny-qwen2-f32.gguf", "tiny-llama-q8_0.gguf", "tiny-qwen3-f32.gguf"):
        model = llm.load(TINY / name, device="cpu", backend="kernels", n_ctx=8, gemv=True,
                         progress=False)
        ids = CASES[name][0]["tokens"][:3]
        session = model.session()
        session.reset()
        session.prefill(ids[:2])
        step = session.step(ids[2])
        reference = llm.load(TINY / name, device="cpu", backend="numpy", n_ctx=8, progress=False)
        tol = Q8_0_TOL if "q8_0" in name else NUMPY_TOL
        err = rel_l2(step, reference.logits(ids)[-1])
        assert err < tol, f"{name}: decode step vs numpy backend {err:.2e}"
        launches = [launch.name for launch in session.cache.graph.graph.launches]
        counts[name] = {k: launches.count(k) for k in set(launches)}
    n_layer = 2
    assert "add_bias" not in counts["tiny-qwen2-f32.gguf"], counts
    llama = counts["tiny-llama-q8_0.gguf"]
    assert "rmsnorm_regs" not in llama and llama["rmsnorm_q8_1_kernel"] == 2 * n_layer + 1, llama
    # left: the Q8_1 inputs of the attention-output and down GEMVs
    assert llama["q8_1_quantize_kernel"] == 2 * n_layer, llama
    qwen3 = counts["tiny-qwen3-f32.gguf"]   # f32 weights: the norms stay plain launches
    assert qwen3["rmsnorm_regs"] == 2 * n_layer + 1, qwen3          # no q / k norm launches
    assert qwen3["rope_qkv_cache"] == n_layer, qwen3


def test_stdlib_gemv_path_on_cpu_target():
    """The GPU's GEMV (DP4A on Q8_1 activations) also runs here, on two tokens, and its
    prefill GEMMs (int8, residual added in their store) on 13."""
    name = "tiny-llama-q8_0.gguf"
    model = llm.load(TINY / name, device="cpu", backend="kernels", n_ctx=16, gemv=True,
                     progress=False)
    case = CASES[name][0]
    err = rel_l2(model.logits(case["tokens"][:2]), np.asarray(case["logits"][:2], np.float32))
    assert err < Q8_0_TOL, f"GEMV path: relative L2 vs llama.cpp {err:.2e}"
    case = next(c for c in CASES[name] if len(c["tokens"]) == 13)
    err = rel_l2(model.logits(case["tokens"]), np.asarray(case["logits"], np.float32))
    assert err < Q8_0_TOL, f"GEMM path: relative L2 vs llama.cpp {err:.2e}"


def test_memory_report(models):
    import gc
    model = models["tiny-llama-f32.gguf"]
    report = model.backend.memory_report()
    assert report["weights"] > 0 and report["total"] >= report["weights"]
    assert report["total"] == sum(report[k] for k in ("weights", "kv_cache", "activations",
                                                       "scratch"))
    cfg = model.config
    cache = model.backend.kv_cache(cfg.n_layer, 40, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v)
    grown = model.backend.memory_report()["kv_cache"]
    assert grown - report["kv_cache"] == cache.nbytes == 40 * cfg.kv_bytes_per_token
    del cache                                   # the report counts live caches only
    gc.collect()
    assert model.backend.memory_report()["kv_cache"] == report["kv_cache"]


def test_synth_reads_back_with_gguf_py(tmp_path):
    path = write_synthetic("smollm2-135m", "Q4_1", tmp_path / "s.gguf")
    reader = GGUFReader(path)
    shape = SHAPES["smollm2-135m"]
    got = {t.name: (Q(t.tensor_type), tuple(int(d) for d in reversed(t.shape.tolist())))
           for t in reader.tensors}
    plan = tensor_plan(shape, "Q4_1")
    assert len(got) == len(plan)
    for name, qtype, (rows, cols) in plan:
        expected_shape = (cols,) if rows == 1 else (rows, cols)
        assert got[name] == (qtype, expected_shape), name
    assert got["blk.0.attn_q.weight"][0] == Q.Q4_1
    tokens = reader.fields["tokenizer.ggml.tokens"]
    assert len(tokens.data) == shape.n_vocab
    model = llm.load(path, device="cpu", n_ctx=8, progress=False)
    ids = model.tokenizer.encode("hello world")
    assert model.tokenizer.decode(ids) == "hello world"
    assert np.isfinite(model.logits(ids[:2])).all()


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K])
def test_synth_weights_are_centred_and_spread_like_trained_ones(qtype, rng, seed):
    """Random quant bytes, but each matrix dequantizes to mean ~0 and std ~WEIGHT_STD (a
    positive mean per block made the synthetic models' activations overflow to NaN)."""
    from gguf.quants import dequantize
    from llm.synth import WEIGHT_STD, random_blocks
    w = dequantize(random_blocks(rng, qtype, 32, 2048), qtype)
    assert abs(w.mean()) < 0.15 * WEIGHT_STD, f"{qtype.name} mean {w.mean()} (seed {seed})"
    assert 0.8 * WEIGHT_STD < w.std() < 1.25 * WEIGHT_STD, f"{qtype.name} std {w.std()}"


@pytest.mark.parametrize("file_type,matrix,output", [("Q8_0", Q.Q8_0, Q.Q8_0),
                                                     ("Q6_K", Q.Q6_K, Q.Q6_K),
                                                     ("Q4_0", Q.Q4_0, Q.Q6_K)])
def test_single_type_files(file_type, matrix, output):
    plan = {name: qtype for name, qtype, _ in tensor_plan(SHAPES["llama-8b"], file_type)}
    assert plan["output.weight"] == output
    assert {plan[f"blk.{il}.{t}.weight"] for il in (0, 13, 31)
            for t in ("attn_q", "attn_v", "ffn_down", "ffn_gate")} == {matrix}


@pytest.mark.parametrize("file_type,base", [("Q4_K_M", Q.Q4_K), ("Q5_K_M", Q.Q5_K)])
def test_k_m_mixes_follow_llama_cpp(file_type, base):
    plan = {name: qtype for name, qtype, _ in tensor_plan(SHAPES["llama-8b"], file_type)}
    assert plan["output.weight"] == Q.Q6_K and plan["token_embd.weight"] == base
    six = [il for il in range(32) if plan[f"blk.{il}.ffn_down.weight"] == Q.Q6_K]
    assert six == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert all(plan[f"blk.{il}.attn_v.weight"] == Q.Q6_K for il in six)
    assert plan["blk.5.attn_q.weight"] == base and plan["blk.5.attn_v.weight"] == base


def test_bench_table_format(models):
    model = models["tiny-llama-f32.gguf"]
    out = table(model, "pykernel kernels (cpu)",
                [BenchResult("pp512", [100.0, 110.0, 120.0]), BenchResult("tg128", [50.0])])
    lines = out.splitlines()
    assert lines[0] == "| model | size | params | backend | test | t/s |"
    row = re.compile(r"^\| .+ \| [\d.]+ (MiB|GiB) \| [\d.]+ (M|B) \| pykernel kernels \(cpu\) "
                     r"\| (pp512|tg128) \| [\d.]+ ± [\d.]+ \|$")
    assert all(row.match(line) for line in lines[2:]), out
    assert "| pp512 | 110.00 ± 10.00 |" in out and "| tg128 | 50.00 ± 0.00 |" in out


def test_bench_at_depth(models):
    """`pykernel bench -d D`: both tests run with D tokens already in the cache, labelled as
    llama-bench labels them."""
    model = models["tiny-llama-f32.gguf"]
    results = run_bench(model, p=4, n=3, r=1, depth=5)
    assert [r.test for r in results] == ["pp4 @ d5", "tg3 @ d5"]
    assert all(r.mean > 0 for r in results)


def test_bench_lists_like_llama_bench():
    """-p / -n / -d lists: every prompt length and token count at every depth, in llama-bench's
    order, from one model load; the CLI parses "0,5" and refuses what is not a list of
    non-negative integers."""
    import argparse
    from llm.cli_bench import int_list
    from tests.llm.gguf_helpers import TINY_LLAMA
    out = bench(TINY_LLAMA, p=[4, 6], n=[3], r=1, device="cpu", backend="kernels",
                depth=[0, 5])
    tests = [line.split("|")[5].strip() for line in out.splitlines()[2:] if line.startswith("|")]
    assert tests == ["pp4", "pp6", "tg3", "pp4 @ d5", "pp6 @ d5", "tg3 @ d5"], out
    assert int_list("0,5") == [0, 5] and int_list("512") == [512]
    for bad in ("4,x", "-1", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            int_list(bad)
    with pytest.raises(ValueError, match=">= 0"):
        bench(TINY_LLAMA, p=[-1], device="cpu", backend="kernels")


# Prompts of up to 8 tokens on the GEMV, as the decode steps they are compared with: the int8
# GEMM (from 6 tokens by default) takes Q4_0's offset exactly where the DP4A GEMV uses the
# activations' f16 sum, ~5e-3 apart per matmul, which these random models amplify past the
# decode-vs-prefill bounds (both paths are checked against the numpy backend)
GEMV_PROMPTS = RunnerOptions(kernels=KernelOptions(int8_gemm_tokens=9))


@pytest.mark.slow
def test_split_decode_feeds_q8_1_to_the_o_projection(tmp_path, monkeypatch):
    """A head_dim-64 model (a tiny synthetic llama): in both decode graphs the attention kernel
    that writes the output (the split kernel without splits, the combine kernel with them) also
    writes the o-projection's Q8_1 input, so each layer has one quantize launch fewer; the
    decode steps still give the prefill's logits."""
    from llm import synth
    monkeypatch.setitem(synth.SHAPES, "tiny-d64", synth.Shape(
        "llama", 128, 256, 2, 2, 1, 512, 64, 10000.0, 1e-5, True, False, "llama-bpe"))
    path = synth.write_synthetic("tiny-d64", "Q4_0", tmp_path / "tiny-d64.gguf")
    model = llm.load(path, device="cpu", backend="kernels", n_ctx=16, gemv=True,
                     options=replace(GEMV_PROMPTS, short_context=4),
                     progress=False)
    ids = [5, 9, 13, 17, 21, 25]
    full = model.logits(ids)
    session = model.session()
    session.reset()
    steps = [session.prefill(ids[:2])[0]] + [session.step(t) for t in ids[2:]]
    assert rel_l2(np.stack(steps), full[1:]) < 1e-2, rel_l2(np.stack(steps), full[1:])
    for short in (True, False):                 # no splits / split attention + combine
        launches = [launch.name for launch in session.cache.graphs[short].graph.launches]
        assert ("combine_splits" in launches) != short, launches
        assert launches.count("q8_1_quantize_kernel") == 2, launches   # the down GEMVs' inputs


@pytest.mark.parametrize("device_kind", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_graph_argmax_many_blocks(device_kind, rng, seed):
    """The decode graph's argmax (kernels_extra.argmax_into): several blocks and the last-block
    merge, ties to the lowest index, the position advanced only when asked, replayable (the
    ticket counter resets); -1 for a row without a finite largest logit."""
    import pykernel as pk
    from llm.backends.kernels_extra import argmax_into, argmax_scratch
    if device_kind == "cuda" and not pk.gpu_available():
        pytest.skip("no usable CUDA GPU")
    pk.set_device(device_kind)
    for n in (9001, 4096 * 3, 151936 if device_kind == "cuda" else 20000):
        x = rng.standard_normal(n).astype(np.float32)
        top = rng.choice(n, size=2, replace=False)
        x[top] = x.max() + 1.0                       # a tie: the lower index wins
        io = pk.to_device(np.array([-1, 41], np.int32))
        dx = pk.to_device(x)
        scratch = argmax_scratch(n)
        for step in range(2):
            argmax_into(dx, io, advance=True, scratch=scratch)
            assert io.numpy().tolist() == [int(top.min()), 42 + step], f"n={n} (seed {seed})"
        argmax_into(dx, io, advance=False, scratch=scratch)
        assert io.numpy().tolist() == [int(top.min()), 43], f"n={n} (seed {seed})"
    # no finite largest logit (all NaN, only -Inf, a +Inf among numbers): -1, the host's
    # NonFiniteLogitsError (a broken model), never 2**31 - 1 nor a token
    x = rng.standard_normal(9001).astype(np.float32)
    x[rng.integers(0, 9001)] = np.inf
    for position, row in enumerate([np.full(9001, np.nan, np.float32),
                                    np.full(9001, -np.inf, np.float32), x], start=44):
        io = pk.to_device(np.array([7, position - 1], np.int32))
        argmax_into(pk.to_device(row), io, advance=True, scratch=argmax_scratch(9001))
        assert io.numpy().tolist() == [-1, position], f"seed {seed}"


def test_embed_rows_of_an_id_out_of_range_are_nan(rng, seed):
    """kernels_extra.embed_rows (rows of any GGUF type; Q8_0 here, as the q8_0 models' decode
    graphs read them): an id outside [0, vocab) (the decode graph's -1 flag for a broken row,
    argmax's 2**31 - 1) gives a NaN row, never a read outside the table (the CPU target
    checks every access); the valid ids their rows, bit for bit. Output poisoned."""
    import pykernel as pk
    from gguf import quants
    from llm.backends.kernels_extra import embed_rows
    from stdlib_kernels.embed import embedding_reference
    pk.set_device("cpu")
    vocab, n = 37, 64
    table = quants.quantize(rng.standard_normal((vocab, n)).astype(np.float32), Q.Q8_0)
    ids = np.array([-1, 3, vocab, vocab - 1, 2**31 - 1, 0, -2**31], np.int32)
    out = pk.full((ids.size, n), 7.0, np.float32)
    embed_rows(pk.to_device(table), "Q8_0", pk.to_device(ids), out, 2.0)
    got = out.numpy()
    bad = (ids < 0) | (ids >= vocab)
    assert np.isnan(got[bad]).all(), f"seed {seed}"
    expected = embedding_reference(table, ids[~bad], 2.0, qtype="Q8_0").astype(np.float32)
    assert np.array_equal(got[~bad], expected), f"seed {seed}"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_pick_and_embedding_kernels_ptx_assemble(arch, assemble):
    """argmax_next (its -1 flag) and embed_generic (its id check): PTX that ptxas accepts."""
    from llm.backends.kernels_extra import argmax_next, embed_generic
    from stdlib_kernels.quant.dequant_kernels import CODES
    assemble(argmax_next.ptx(arch, VEC=4, UNITS=4, ADVANCE=True), arch)
    assemble(embed_generic.ptx(arch, FMT=CODES["Q8_0"], BE=32, BB=34), arch)


@pytest.mark.slow
def test_qwen3_head_norms_inside_the_rope_launch(tmp_path, monkeypatch):
    """A tiny synthetic qwen3 (head_dim 64: the runner's tensor-core attention paths): q_norm /
    k_norm applied inside the RoPE + KV-cache launch in prefill (q|k|v read in place) and in the
    decode graph give the numpy backend's logits, with no separate head-norm launch."""
    from llm import synth
    monkeypatch.setitem(synth.SHAPES, "tiny-q3", synth.Shape(
        "qwen3", 128, 256, 2, 2, 1, 512, 64, 1e6, 1e-6, False, False, "qwen2", qk_norm=True))
    path = synth.write_synthetic("tiny-q3", "Q4_0", tmp_path / "tiny-q3.gguf")
    model = llm.load(path, device="cpu", backend="kernels", n_ctx=24, gemv=True,
                     options=GEMV_PROMPTS, progress=False)
    reference = llm.load(path, device="cpu", backend="numpy", n_ctx=24, progress=False)
    ids = list(range(3, 3 + 13))                        # 13 tokens: the prefill GEMM path
    err = rel_l2(model.logits(ids), reference.logits(ids))
    assert err < Q8_0_TOL, f"prefill vs numpy backend {err:.2e}"
    session = model.session()
    session.reset()
    steps = [session.prefill(ids[:2])[0]] + [session.step(t) for t in ids[2:6]]
    full = model.logits(ids[:6])
    assert rel_l2(np.stack(steps), full[1:]) < 1e-2
    launches = [launch.name for launch in session.cache.graph.graph.launches]
    assert "rmsnorm_regs" not in launches, launches
    assert launches.count("rope_qkv_cache") == 2, launches


@pytest.mark.slow
def test_q8_0_kv_cache(tmp_path, monkeypatch):
    """--cache-type q8_0 on the CPU target (a head_dim-64 synthetic llama): the cache holds
    ggml's Q8_0 of the rows, the logits follow the numpy backend's q8_0 emulation (within the
    f16 rounding of the rows a prefill reads), decode steps through both graphs (one split /
    splits + combine) follow the prefill, and the cache takes 34/32 bytes per value."""
    from llm import synth
    from stdlib_kernels.attention import Q8Cache
    monkeypatch.setitem(synth.SHAPES, "tiny-d64", synth.Shape(
        "llama", 128, 256, 2, 2, 1, 512, 64, 10000.0, 1e-5, True, False, "llama-bpe"))
    path = synth.write_synthetic("tiny-d64", "Q4_0", tmp_path / "tiny-d64.gguf")
    ids = [5, 9, 13, 17, 21, 25, 3, 8, 40, 41, 42, 43, 44]
    kernels = {kv: llm.load(path, device="cpu", backend="kernels", n_ctx=24, gemv=True,
                            options=replace(GEMV_PROMPTS, short_context=5),
                            activations="f32", kv_dtype=kv, progress=False)
               for kv in ("f32", "q8_0")}
    numpy = {kv: llm.load(path, device="cpu", backend="numpy", n_ctx=24, kv_dtype=kv,
                          progress=False).logits(ids) for kv in ("f32", "q8_0")}
    model = kernels["q8_0"]
    logits = model.logits(ids)
    assert rel_l2(logits, numpy["q8_0"]) < 5e-3, rel_l2(logits, numpy["q8_0"])
    # the quantization is visible: q8_0 logits differ from f32 ones by more than the kernels'
    # own error (measured ~5e-3 vs ~6e-4 here)
    assert rel_l2(numpy["q8_0"], numpy["f32"]) > 4 * rel_l2(kernels["f32"].logits(ids),
                                                           numpy["f32"])
    session = model.session()
    session.reset()
    steps = [session.prefill(ids[:2])[0]] + [session.step(t) for t in ids[2:8]]
    assert rel_l2(np.stack(steps), model.logits(ids[:8])[1:]) < 3e-3
    assert sorted(session.cache.graphs) == [False, True]
    cache = session.cache
    assert isinstance(cache.k[0], Q8Cache) and cache.nbytes == 2 * 2 * 24 * 64 * 34 // 32
    assert model.backend.kv_value_bytes == 34 / 32
    with pytest.raises(ValueError, match="unknown KV cache type"):
        llm.load(path, device="cpu", backend="kernels", kv_dtype="q4_0", progress=False)


def test_q8_0_cache_needs_head_dim_multiple_of_32(models):
    """The tiny test models have head_dim 16: a q8_0 cache is refused with the reason."""
    cfg = models["tiny-llama-f32.gguf"].config
    backend = llm.backends.create_backend("cpu", "kernels", kv_dtype="q8_0")
    with pytest.raises(ValueError, match="multiple of 32"):
        backend.kv_cache(cfg.n_layer, 8, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_activations_do_not_grow_with_layers(tmp_path, monkeypatch, arch):
    """Layers alternate between two lists of activation buffers: a 6-layer model takes the
    activation memory of a 2-layer one of the same width, and its logits (prefill, and decode
    through the captured graph) still follow the numpy backend's (qwen2: q/k/v biases, qwen3:
    per-head q/k norms)."""
    from llm import synth
    arena_bytes = {}
    for layers in (2, 6):
        monkeypatch.setitem(synth.SHAPES, f"tiny-l{layers}", synth.Shape(
            arch, 128, 256, layers, 2, 1, 512, 64, 10000.0, 1e-5, arch == "llama",
            arch == "qwen2", "llama-bpe", qk_norm=arch == "qwen3"))
        path = synth.write_synthetic(f"tiny-l{layers}", "Q4_0", tmp_path / f"l{layers}.gguf")
        model = llm.load(path, device="cpu", backend="kernels", n_ctx=24, gemv=True,
                         options=GEMV_PROMPTS, progress=False)
        ids = [5, 9, 13, 17, 21, 25, 3, 8, 40, 41, 42, 43, 44]
        logits = model.logits(ids)
        arena_bytes[layers] = model.backend.prefill_arena.nbytes
        if layers == 6:
            want = llm.load(path, device="cpu", backend="numpy", n_ctx=24,
                            progress=False).logits(ids)
            assert rel_l2(logits, want) < Q8_0_TOL, rel_l2(logits, want)
            session = model.session()
            session.reset()
            steps = [session.prefill(ids[:2])[0]] + [session.step(t) for t in ids[2:6]]
            assert rel_l2(np.stack(steps), model.logits(ids[:6])[1:]) < 1e-2
    assert arena_bytes[6] == arena_bytes[2], arena_bytes


def test_f32_weights_past_8_tokens_on_the_gemv():
    """F32 weights keep the f32 GEMV at any token count (8-token launches, the GLU's gate|up
    then its activation launch): a 12-token prompt with gemv=True on the CPU target gives the
    numpy backend's logits."""
    path = TINY / "tiny-llama-f32.gguf"
    ids = list(range(3, 15))
    model = llm.load(path, device="cpu", backend="kernels", gemv=True, n_ctx=32, progress=False)
    want = llm.load(path, device="cpu", backend="numpy", n_ctx=32, progress=False).logits(ids)
    assert rel_l2(model.logits(ids), want) < 1e-5
