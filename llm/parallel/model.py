"""The tensor-parallel model as `llm.model.Model` drives it: one transformer and one backend.

Input: a `ranks` object (`LocalRanks`, or `launch.ProcessRanks` on GPUs) that runs commands on
every rank. Output: `TensorParallelTransformer` (a `StepRunner`: forward(step, caches) with the
full config; logits are host float32 rows of the whole vocabulary, gathered from the ranks'
shards) and `TensorParallelBackend` (KV caches that are one cache per rank, host-side logits
ops). Generation, chat, the batch scheduler, bench and perplexity run on them unchanged.

`build_local` builds N ranks in this process (the numpy backend, or the kernels backend on the
CPU target): each loads its shard (`ShardedFile`) with `load_weights` and runs a plain
`Transformer` whose backend all-reduces through a `LocalGroup` communicator.
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from llm import step as S
from llm.backends.base import Backend, KVCache
from llm.config import ModelConfig
from llm.gguf_file import GGUFFile
from llm.models.transformer import StepRunner, Transformer
from llm.models.weights import load_weights
from llm.parallel.communicator import LocalGroup
from llm.parallel.plan import ShardPlan, local_config, plan_shards
from llm.parallel.ranks import LocalRanks, RankRunner, step_to_wire
from llm.parallel.shard_file import ShardedFile
from llm.sampling import check_device_picks
from llm.step import Step


class ShardedKVCache(KVCache):
    """One sequence's cache: cache `cid` on every rank (each holding its KV heads)."""

    def __init__(self, ranks, cid: int, n_layer: int, n_ctx: int, nbytes: int):
        self.ranks, self.cid, self.n_layer, self.n_ctx = ranks, cid, n_layer, n_ctx
        self._nbytes = nbytes

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def copy_from(self, other: ShardedKVCache, n_rows: int) -> None:
        self.ranks.command({"op": "copy_cache", "dst": self.cid, "src": other.cid,
                            "n_rows": int(n_rows)})

    def __del__(self):
        # queued, not sent: a collection may run in the middle of another command
        self.ranks.release(self.cid)


def _rank_only(self, *args, **kwargs):
    raise TypeError("a tensor-parallel model's ops run on its ranks' backends; the group "
                    "backend only makes KV caches and reads logits")


class TensorParallelBackend(Backend):
    """The group's face towards generation: caches on every rank, logits as host rows.
    use_graphs: generation asks the transformer's greedy_tokens for greedy decoding (each
    rank's argmax of its vocabulary shard, reduced), not for a whole logits row."""
    logits_on_device = False
    use_graphs = True

    def __init__(self, ranks, plan: ShardPlan, rank_backend: Backend, cfg: ModelConfig):
        self.ranks, self.plan, self.cfg = ranks, plan, cfg
        self.name = f"{rank_backend.name} (tp={plan.n_ranks})"
        self.options = rank_backend.options
        self.kv_value_bytes = rank_backend.kv_value_bytes
        self.model_features = rank_backend.model_features
        self.rank_backend = rank_backend
        self._ids = itertools.count()

    def kv_device_budget(self) -> int | None:
        """Rank 0's budget as a whole-model one (model.choose_context sizes the context from
        the full config's bytes per token; a rank holds n_head_kv / its KV heads of them)."""
        budget = self.rank_backend.kv_device_budget()
        if budget is None:
            return None
        return budget * self.cfg.n_head_kv // self.plan.ranks[0].kv_heads.count

    def memory_report(self) -> dict | None:
        """Rank 0's device memory (every rank holds about as much)."""
        return self.rank_backend.memory_report()

    def kv_cache(self, n_layer, n_ctx, n_head_kv, head_dim, head_dim_v) -> ShardedKVCache:
        return self.kv_caches(1, n_layer, n_ctx, n_head_kv, head_dim, head_dim_v)[0]

    def kv_caches(self, n_slots, n_layer, n_ctx, n_head_kv, head_dim, head_dim_v) -> list:
        """n_slots caches; the ranks size theirs from their own configs (their KV heads)."""
        ids = [next(self._ids) for _ in range(n_slots)]
        self.ranks.command({"op": "kv_caches", "ids": ids, "n_ctx": int(n_ctx)})
        per_rank = (self.plan.ranks[0].kv_heads.count * n_layer * n_ctx *
                    (head_dim + head_dim_v) * self.kv_value_bytes)
        return [ShardedKVCache(self.ranks, cid, n_layer, n_ctx,
                               int(per_rank * self.plan.n_ranks)) for cid in ids]

    matrix = vector = embedding = embed = matmul = split = add = rms_norm = _rank_only
    layer_norm = rope = attention = moe_route = moe_experts = _rank_only
    swiglu = geglu_tanh = gelu = _rank_only

    def last_row(self, x):
        return x[-1:]

    def rows(self, x, indices):
        return x[np.asarray(indices, np.int64)]

    def to_host(self, x):
        return np.asarray(x, dtype=np.float32)


class TensorParallelTransformer(StepRunner):
    """The group as one model: forward(step, caches) sends the step to every rank (each runs
    it on its shard, with the ids remapped to its vocabulary rows: RankRunner) and returns
    the whole logits rows on the host. forward_tokens / forward_batch / forward_prompts are
    StepRunner's constructors."""

    def __init__(self, cfg: ModelConfig, spec, ranks, backend: TensorParallelBackend):
        self.cfg, self.spec, self.backend, self.ranks = cfg, spec, backend, ranks

    def forward(self, step: Step, caches: Sequence[ShardedKVCache]):
        return self.ranks.command(forward_command(step, caches))

    def greedy_tokens(self, first_token: int, pos: int, cache: ShardedKVCache, n: int):
        """Up to n greedy tokens after first_token at pos: per step only each rank's largest
        logit and its id are gathered (plan.reduce_argmax), not the logits."""
        token = int(first_token)
        for at in range(pos, pos + n):
            picks = self.ranks.command(forward_command(S.tokens([token], at), [cache],
                                                       pick="argmax"))
            token = int(check_device_picks(picks, self.cfg.n_vocab)[0])   # -1: no finite logit
            yield token


def forward_command(step: Step, caches: Sequence[ShardedKVCache], pick: str | None = None):
    """The ranks' "forward" command: the step (global token ids) and its caches' ids."""
    if len(caches) != len(step.counts):
        raise ValueError(f"a {step.kind} step of {len(step.counts)} sequence(s) needs as many "
                         f"caches, got {len(caches)}")
    if not all(isinstance(c, ShardedKVCache) for c in caches):
        raise TypeError("a tensor-parallel model runs on its own caches (model.backend."
                        "kv_cache / kv_caches), one per rank behind each")
    cmd = {"op": "forward", "step": step_to_wire(step), "caches": [c.cid for c in caches]}
    if pick is not None:
        cmd["pick"] = pick
    return cmd


def rank_transformer(gguf: GGUFFile, cfg: ModelConfig, spec, plan: ShardPlan, rank: int,
                     backend: Backend) -> Transformer:
    """Rank `rank`'s transformer: its shard of the file's weights on `backend` (the kernels
    backend's wrapped in a GraphRunner, as llm.load does, whose prompt-graph limit the ranks
    agree on: rank_graphs)."""
    local = local_config(cfg, plan.ranks[rank])
    weights = load_weights(ShardedFile(gguf, cfg, plan, rank), local, spec, backend)
    transformer = Transformer(local, spec, weights, backend)
    if backend.name == "kernels":     # its steps (eager or captured) go through the wrapper
        from llm.parallel.rank_graphs import RankGraphRunner
        transformer = RankGraphRunner(transformer)   # kernels_graph.wrap's, agreeing on shapes
    return transformer


def widest_vocab(plan: ShardPlan) -> int:
    return max(s.vocab.count for s in plan.ranks)


def local_group(n_ranks: int, options) -> LocalGroup:
    """The in-process group: its all-reduces through the one-shot peer kernel on the CPU
    target when options.peer_allreduce_kb asks for it (what tests the protocol end to end)."""
    if options.peer_allreduce_kb:
        from llm.parallel.peer_allreduce import LocalPeerGroup
        return LocalPeerGroup(n_ranks, options.peer_allreduce_kb * 1024)
    return LocalGroup(n_ranks)


def build_local(gguf: GGUFFile, cfg: ModelConfig, spec, plan: ShardPlan, make_backend):
    """(transformer, backend) of N ranks in this process; make_backend() gives each rank its
    own backend (numpy, or kernels on the CPU target without graphs: a LocalGroup's sum is
    host code, which a captured graph would not replay)."""
    backends = [make_backend() for _ in range(plan.n_ranks)]
    group = local_group(plan.n_ranks, backends[0].options)
    runners = []
    for rank, (comm, backend) in enumerate(zip(group.communicators(), backends)):
        backend.communicator = comm
        backend.use_graphs = False
        runners.append(RankRunner(rank_transformer(gguf, cfg, spec, plan, rank, backend),
                                  backend, plan.ranks[rank], widest_vocab(plan)))
    ranks = LocalRanks(runners, group, plan)
    backend = TensorParallelBackend(ranks, plan, runners[0].backend, cfg)
    return TensorParallelTransformer(cfg, spec, ranks, backend), backend


def load_sharded(path, gguf: GGUFFile, cfg: ModelConfig, spec, tp: int, backend: Backend,
                 make_backend, backend_options: dict):
    """llm.load's tp > 1: (transformer, backend) of the group. On a GPU, one process per rank
    (llm.parallel.gpu; `backend` becomes rank 0's); on the CPU, tp ranks in this process,
    `backend` rank 0's and make_backend() the others'."""
    plan = plan_shards(cfg, tp)
    if getattr(backend, "device", None) is not None and backend.device.kind == "cuda":
        from llm.parallel.gpu import load_gpu_group
        return load_gpu_group(path, gguf, cfg, spec, tp, backend, backend_options)
    backends = iter([backend])
    return build_local(gguf, cfg, spec, plan, lambda: next(backends, None) or make_backend())
