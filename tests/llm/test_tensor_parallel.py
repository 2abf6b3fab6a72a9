"""Tensor parallelism on the CPU: the tiny models split over 2 and 4 in-process ranks
(LocalGroup) against the unsharded model, on the numpy backend.

How close the logits must be. A split changes one thing in the arithmetic: a row-parallel
matmul's K terms are summed per rank and the partial sums added in rank order, not in BLAS's
single order (the vocabulary-split embedding adds zeros, exactly). Both orders are correct
roundings of the same sums (each within gamma_K * sum|terms| of the exact value), so:
- in float64 the two models must agree to float64 rounding: a sum of K <= n_ff = 128 terms
  lies within gamma_128 = 1.4e-14 of sum|terms| (of the order of the largest logit here),
  amplified by two layers of norms and softmax (at most O(10) on these random models), so
  F64_REL = 1e-12 of the largest logit (measured ~1.2e-15), while a misplaced head, bias or
  vocabulary row moves logits by O(1);
- in float32 (what the runner runs) each model's distance to the exact logits is its float32
  forward error, which the float64 run measures: |tpN - tp1| <= |tpN - exact| + |tp1 - exact|,
  both of one error model; we allow F32_FACTOR = 4 times the unsharded model's measured error
  (2 for the two models, 2 for the spread of the error between two orders).
Greedy tokens must be identical wherever the top two logits are further apart than that bound.
"""
import numpy as np
import pytest

import llm
from llm.backends.dequant import dequantize
from llm.backends.numpy_backend import NumpyBackend, NumpyKVCache
from llm.config import load_config
from llm.gguf_file import GGUFFile
from llm.models.archs import ARCH_SPECS
from llm.models.transformer import Transformer
from llm.models.weights import load_weights
from llm.parallel.model import build_local
from llm.parallel.plan import ShardingError, plan_shards
from tests.llm.gguf_helpers import TINY, require_for_module

require_for_module(TINY / "tiny-llama-f32.gguf")
F64_REL = 1e-12
F32_FACTOR = 4.0
# (file, tp): every tiny model has 4 query heads and 2 KV heads, so tp=4 replicates each KV
# head on two ranks; qwen2 has q/k/v biases, gpt2 a fused qkv with biases on every matmul
# (row-parallel ones added once), learned positions and LayerNorm; q8_0 splits Q8_0 rows
CASES = [("tiny-llama-f32.gguf", 2), ("tiny-llama-f32.gguf", 4), ("tiny-qwen2-f32.gguf", 2),
         ("tiny-qwen2-f32.gguf", 4), ("tiny-qwen3-f32.gguf", 4), ("tiny-gpt2-f32.gguf", 2),
         ("tiny-gpt2-f32.gguf", 4), ("tiny-llama-q8_0.gguf", 2)]


class Float64KVCache(NumpyKVCache):
    def _grow(self, rows: int) -> None:
        super()._grow(rows)
        self.k = [k.astype(np.float64) for k in self.k]
        self.v = [v.astype(np.float64) for v in self.v]


class Float64Backend(NumpyBackend):
    """The numpy backend's ops over float64 weights, activations and cache (its float32
    constants widen on use): the reference for the order of sums alone."""

    def _f32(self, t):
        if t.name not in self._dequantized:
            self._dequantized[t.name] = dequantize(t.data, t.ggml_type, t.shape).astype(
                np.float64)
        return self._dequantized[t.name]

    def matrix(self, parts):
        return np.concatenate([self._f32(t) for t in parts])

    def kv_cache(self, n_layer, n_ctx, n_head_kv, head_dim, head_dim_v):
        return Float64KVCache(n_layer, n_ctx, n_head_kv, head_dim, head_dim_v)

    def to_host(self, x):
        return np.asarray(x, np.float64)


def float64_logits(path, ids, tp: int) -> np.ndarray:
    g = GGUFFile(path)
    cfg = load_config(g)
    spec = ARCH_SPECS[cfg.arch]
    if tp == 1:
        backend = Float64Backend()
        transformer = Transformer(cfg, spec, load_weights(g, cfg, spec, backend), backend)
    else:
        transformer, backend = build_local(g, cfg, spec, plan_shards(cfg, tp), Float64Backend)
    cache = backend.kv_cache(cfg.n_layer, len(ids), cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v)
    logits = transformer.forward_tokens(ids, 0, cache, True)   # float64 host rows (to_host:
    assert logits.dtype == np.float64                                  # the runner's float32)
    return logits


def prompt_ids(rng, n_vocab: int, n: int = 11) -> list[int]:
    return [int(i) for i in rng.integers(0, n_vocab, n)]


@pytest.mark.parametrize("name,tp", CASES)
def test_sharded_float64_logits_equal_the_model_to_rounding(rng, name, tp):
    ids = prompt_ids(rng, 263)
    whole, split = float64_logits(TINY / name, ids, 1), float64_logits(TINY / name, ids, tp)
    err = np.abs(split - whole).max()
    assert err <= F64_REL * np.abs(whole).max(), f"{name} tp={tp}: max |diff| {err:.3e}"


def greedy(model, ids, n: int):
    """(tokens, each step's logits): n greedy steps after prefilling ids."""
    session = model.session()
    session.reset()
    logits = session.prefill(ids)[0]
    tokens, rows = [], []
    for _ in range(n):
        rows.append(logits)
        tokens.append(int(np.argmax(logits)))
        logits = session.step(tokens[-1])
    return tokens, rows


def assert_same_greedy(reference, other, bound: float, label: str) -> None:
    """Identical tokens up to the first step whose top two logits are within 2 * bound."""
    (want, rows), (got, _) = reference, other
    for step, (a, b, row) in enumerate(zip(want, got, rows)):
        top2 = np.sort(row)[-2:]
        if top2[1] - top2[0] <= 2 * bound:
            return      # a near tie: either token is a correct rounding
        assert a == b, f"{label}: greedy token {step} differs ({a} vs {b})"


@pytest.mark.parametrize("name,tp", CASES)
def test_sharded_runner_logits_and_greedy_tokens(rng, name, tp):
    ids = prompt_ids(rng, 263)
    whole = llm.load(TINY / name, n_ctx=64, progress=False)
    split = llm.load(TINY / name, n_ctx=64, progress=False, tp=tp)
    assert split.backend.name == f"numpy (tp={tp})"
    reference = whole.logits(ids)
    bound = F32_FACTOR * np.abs(reference - float64_logits(TINY / name, ids, 1)).max()
    err = np.abs(split.logits(ids) - reference).max()
    assert err <= bound, f"{name} tp={tp}: max |diff| {err:.3e} > bound {bound:.3e}"
    reference_tokens = greedy(whole, ids, 12)
    assert_same_greedy(reference_tokens, greedy(split, ids, 12), bound, f"{name} tp={tp}")
    session = split.session()        # the ranks' argmaxes reduced, no logits gathered
    session.reset()
    first = int(np.argmax(session.prefill(ids)[0]))
    picked = [first, *split.transformer.greedy_tokens(first, len(ids), session.cache, 11)]
    assert_same_greedy(reference_tokens, (picked, None), bound, f"{name} tp={tp} (argmax)")


def test_batched_decode_and_prompts_together_match(rng):
    """The server's two passes (forward_batch, forward_prompts) over sharded caches."""
    name = "tiny-qwen2-f32.gguf"
    whole = llm.load(TINY / name, n_ctx=64, progress=False)
    split = llm.load(TINY / name, n_ctx=64, progress=False, tp=2)
    prompts = [prompt_ids(rng, 263, n) for n in (5, 9, 2)]
    bound = F32_FACTOR * np.abs(whole.logits(prompts[1]) -
                                float64_logits(TINY / name, prompts[1], 1)[-1:]).max() + 1e-6
    outs = []
    for model in (whole, split):
        cfg, t = model.config, model.transformer
        caches = model.backend.kv_caches(3, cfg.n_layer, 64, cfg.n_head_kv, cfg.head_dim,
                                         cfg.head_dim_v)
        first = model.backend.to_host(t.forward_prompts(prompts, [0, 0, 0], caches))
        nxt = model.backend.to_host(t.forward_batch(
            np.array([7, 8, 9]), np.array([len(p) for p in prompts]), caches))
        outs.append(np.concatenate([first, nxt]))
    err = np.abs(outs[1] - outs[0]).max()
    assert err <= bound, f"max |diff| {err:.3e} > {bound:.3e}"


def test_a_split_that_cuts_quant_blocks_is_refused_by_tensor_name():
    with pytest.raises(ShardingError, match="'blk.0.attn_output.weight' \\(Q8_0"):
        llm.load(TINY / "tiny-llama-q8_0.gguf", n_ctx=64, progress=False, tp=4)


def test_a_mixture_of_experts_is_refused():
    with pytest.raises(ShardingError, match="mixture of experts"):
        llm.load(TINY / "tiny-qwen3moe-f32.gguf", n_ctx=64, progress=False, tp=2)


def test_tp_one_is_the_plain_model():
    model = llm.load(TINY / "tiny-llama-f32.gguf", n_ctx=64, progress=False, tp=1)
    assert model.backend.name == "numpy" and model.backend.communicator is None


def test_rank_zero_drives_workers_over_the_control_channel(rng):
    """The GPU layout's protocol on the CPU: rank 0 (ProcessRanks) sends JSON commands to a
    worker (serve_commands) over a socket; a LocalGroup stands in for NCCL."""
    import socket
    import threading

    from llm.backends.numpy_backend import NumpyBackend
    from llm.parallel.communicator import LocalGroup
    from llm.parallel.launch import Channel, ProcessRanks
    from llm.parallel.model import (
        TensorParallelBackend,
        TensorParallelTransformer,
        rank_transformer,
        widest_vocab,
    )
    from llm.parallel.ranks import RankRunner
    from llm.parallel.worker import serve_commands

    path = TINY / "tiny-qwen2-f32.gguf"
    g = GGUFFile(path)
    cfg = load_config(g)
    spec, plan, group = ARCH_SPECS[cfg.arch], plan_shards(cfg, 2), LocalGroup(2)
    runners = []
    for rank, comm in enumerate(group.communicators()):
        backend = NumpyBackend()
        backend.communicator = comm
        runners.append(RankRunner(rank_transformer(g, cfg, spec, plan, rank, backend), backend,
                                  plan.ranks[rank], widest_vocab(plan)))
    a, b = socket.socketpair()
    worker = threading.Thread(target=serve_commands, args=(Channel(b), runners[1],
                                                           lambda: group._turn))
    worker.start()
    ranks = ProcessRanks(runners[0], [Channel(a)], runners[0].backend.communicator, plan)
    face = TensorParallelBackend(ranks, plan, runners[0].backend, cfg)
    transformer = TensorParallelTransformer(cfg, spec, ranks, face)
    ids = prompt_ids(rng, 263, 7)
    with group._turn:
        cache = face.kv_cache(cfg.n_layer, 16, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v)
        got = transformer.forward_tokens(ids, 0, cache, all_logits=True)
    for ch in ranks.channels:
        ch.send({"op": "stop"})
    worker.join(timeout=60)
    whole = llm.load(path, n_ctx=64, progress=False).logits(ids)
    bound = F32_FACTOR * np.abs(whole - float64_logits(path, ids, 1)).max()
    assert np.abs(got - whole).max() <= bound


def kernels_ranks(path, limits: list[int]):
    """RankRunners of the kernels backend on the CPU target, rank r's options allowing prompt
    graphs of up to limits[r] tokens (as GPUs with different free memory fit them), graphs
    on (nothing here replays one: only the choices are looked at), and their LocalGroup."""
    from llm.backends import create_backend
    from llm.options import RunnerOptions
    from llm.parallel.communicator import LocalGroup
    from llm.parallel.model import rank_transformer, widest_vocab
    from llm.parallel.ranks import RankRunner
    g = GGUFFile(path)
    cfg = load_config(g)
    spec, plan, group = ARCH_SPECS[cfg.arch], plan_shards(cfg, len(limits)), LocalGroup(
        len(limits))
    runners = []
    for rank, comm in enumerate(group.communicators()):
        backend = create_backend("cpu", "kernels", options=RunnerOptions(
            prefill_graph_max=limits[rank], precompile=False))
        backend.communicator, backend.use_graphs = comm, True
        runners.append(RankRunner(rank_transformer(g, cfg, spec, plan, rank, backend), backend,
                                  plan.ranks[rank], widest_vocab(plan)))
    return plan, group, runners


def test_ranks_agree_on_the_prompt_graph_limit(rng):
    """A rank's GraphRunner fits its prompt-graph limit to its own GPU; ranks that disagree
    would run one prompt padded into a bucket on one and at its length on another (all-reduces
    of different rows). After the first KV caches every rank has the smallest limit, through
    the in-process group and through rank 0's control channel alike; later caches keep it."""
    import socket
    import threading

    from llm.parallel.launch import Channel, ProcessRanks
    from llm.parallel.model import LocalRanks
    from llm.parallel.worker import serve_commands
    path = TINY / "tiny-llama-f32.gguf"
    for world in (2, 4):     # 4: KV heads replicated
        limits = [int(v) for v in rng.integers(2, 3000, world)]
        plan, group, runners = kernels_ranks(path, limits)
        assert [r.transformer.prefill_graph_max for r in runners] == limits
        ranks = LocalRanks(runners, group, plan)
        for ids in ([0, 1], [2]):
            ranks.command({"op": "kv_caches", "ids": ids, "n_ctx": 16})
            got = [r.transformer.prefill_graph_max for r in runners]
            assert got == [min(limits)] * world, f"limits {limits}: ranks use {got}"
    limits = [int(v) for v in rng.integers(2, 3000, 2)]
    plan, group, runners = kernels_ranks(path, limits)
    a, b = socket.socketpair()
    worker = threading.Thread(target=serve_commands, args=(Channel(b), runners[1],
                                                           lambda: group._turn))
    worker.start()
    ranks = ProcessRanks(runners[0], [Channel(a)], runners[0].backend.communicator, plan)
    with group._turn:
        ranks.command({"op": "kv_caches", "ids": [0], "n_ctx": 16})
    ranks.close()          # stop, then rank 0's own close (a no-op communicator here)
    worker.join(timeout=60)
    assert not worker.is_alive()
    got = [r.transformer.prefill_graph_max for r in runners]
    assert got == [min(limits)] * 2, f"limits {limits}: ranks use {got}"
    assert not runners[0].caches, "close drops the rank's caches (and their graphs)"


def test_cli_run_with_tp():
    from tests.llm.cli_helpers import pykernel
    model = TINY / "tiny-llama-f32.gguf"
    runs = [pykernel("run", "Hello there", "-n", "8", "--temp", "0", "--device", "cpu",
                     "--model", model, "--tp", tp) for tp in (1, 2)]
    assert all(r.returncode == 0 for r in runs), runs[1].stderr
    assert runs[0].stdout == runs[1].stdout and "numpy (tp=2)" in runs[1].stderr
    bad = pykernel("run", "x", "--device", "cpu", "--model", TINY / "tiny-llama-q8_0.gguf",
                   "--tp", "4")
    assert bad.returncode == 1 and "attn_output.weight" in bad.stderr


def test_greedy_steps_without_a_finite_logit_raise(tmp_path):
    """NaN output weights: the ranks' reduced argmax is -1, NonFiniteLogitsError (as the
    kernels backend's device picks), never a token."""
    from llm.sampling import NonFiniteLogitsError
    from tests.llm.gguf_helpers import rewrite
    src = TINY / "tiny-llama-f32.gguf"
    shape = GGUFFile(src).tensors["output.weight"].shape
    path = rewrite(src, tmp_path / "nan.gguf",
                   tensors={"output.weight": (np.full(shape, np.nan, np.float32), None)})
    model = llm.load(path, n_ctx=32, progress=False, tp=2)
    session = model.session()
    session.prefill([1, 2, 3])
    with pytest.raises(NonFiniteLogitsError):
        next(model.transformer.greedy_tokens(4, 3, session.cache, 2))
