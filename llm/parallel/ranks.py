"""One tensor-parallel rank's model, and the ranks of one process stepped together.

Input: commands (plain dicts, JSON-safe so that a GPU worker process can receive them over a
socket): build KV caches, copy one, run `forward` / `forward_batch` / `forward_prompts` with
global token ids and cache ids. Output: each rank's logits columns as a host array padded to
the widest shard, which the driver (`llm.parallel.model`) cuts and concatenates in vocabulary
order.

`RankRunner` is one rank: its transformer over its shard of the weights (a KV cache per cache id
for its heads), its backend with a `Communicator`. `LocalRanks` runs N of them in one process
through a `LocalGroup` (the CPU path); `llm.parallel.launch` runs one per GPU process.
"""
from __future__ import annotations

import numpy as np

from llm.parallel.communicator import LocalGroup
from llm.parallel.plan import RankShard, ShardPlan, local_token_ids, reduce_argmax

COLLECTIVE_OPS = ("forward", "forward_batch", "forward_prompts")


class RankRunner:
    """One rank: transformer (its `cfg` is the rank's local config) + backend + caches."""

    def __init__(self, transformer, backend, shard: RankShard, widest_vocab: int):
        self.transformer, self.backend, self.shard = transformer, backend, shard
        self.widest = widest_vocab          # the widest shard's columns (the gather's width)
        self.caches: dict[int, object] = {}

    def run(self, cmd: dict):
        """One command's result: padded host logits for the forward ops, else None."""
        op = cmd["op"]
        if op == "kv_caches":
            cfg = self.transformer.cfg
            made = self.backend.kv_caches(len(cmd["ids"]), cfg.n_layer, cmd["n_ctx"],
                                          cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v)
            self.caches.update(zip(cmd["ids"], made))
            return None
        if op == "copy_cache":
            self.caches[cmd["dst"]].copy_from(self.caches[cmd["src"]], cmd["n_rows"])
            return None
        if op == "drop_caches":
            for cid in cmd["ids"]:
                self.caches.pop(cid, None)
            return None
        if op not in COLLECTIVE_OPS:
            raise ValueError(f"unknown tensor-parallel command {op!r}")
        logits = self.backend.to_host(self._forward(op, cmd))
        if cmd.get("pick") == "argmax":
            return self._row_maxima(logits)
        return self._padded(logits)

    def _row_maxima(self, logits: np.ndarray) -> np.ndarray:
        """(2, n) float64: each row's largest logit among the rank's own columns and its
        global token id (the lowest on ties; exact in float64), for reduce_argmax."""
        own = np.where(np.isnan(logits[:, :self.shard.vocab.count]), -np.inf,
                       logits[:, :self.shard.vocab.count])
        best = own.argmax(axis=1)
        return np.stack([own[np.arange(len(own)), best], best + self.shard.vocab.first])

    def _forward(self, op: str, cmd: dict):
        t, vocab = self.transformer, self.shard.vocab
        if op == "forward":
            ids = local_token_ids(np.asarray(cmd["ids"]), vocab)
            return t.forward(ids, cmd["start"], self.caches[cmd["cache"]], cmd["all_logits"])
        caches = [self.caches[c] for c in cmd["caches"]]
        if op == "forward_batch":
            ids = local_token_ids(np.asarray(cmd["ids"]), vocab)
            return t.forward_batch(ids, np.asarray(cmd["positions"], np.int64), caches)
        prompts = [local_token_ids(np.asarray(p), vocab) for p in cmd["prompts"]]
        return t.forward_prompts(prompts, list(cmd["starts"]), caches)

    def _padded(self, logits: np.ndarray) -> np.ndarray:
        """(n, widest): this rank's columns, its zero row's column dropped, then zeros (every
        rank's array has one shape for the gather)."""
        out = np.zeros((logits.shape[0], self.widest), logits.dtype)
        out[:, :self.shard.vocab.count] = logits[:, :self.shard.vocab.count]
        return out


def join_logits(parts: list[np.ndarray], plan: ShardPlan, cmd: dict) -> np.ndarray:
    """Every rank's result of a forward command -> the full (n, n_vocab) logits rows, in
    vocabulary order, or (pick "argmax") each row's greedy token id."""
    if cmd.get("pick") == "argmax":
        return reduce_argmax(np.stack([p[0] for p in parts]),
                             np.stack([p[1] for p in parts]).astype(np.int64))
    return np.concatenate([p[:, :s.vocab.count] for p, s in zip(parts, plan.ranks)], axis=1)


class LocalRanks:
    """N RankRunners in this process; forward commands run on N threads of a LocalGroup."""

    def __init__(self, runners: list[RankRunner], group: LocalGroup, plan: ShardPlan):
        self.runners, self.group, self.plan = runners, group, plan
        self.released: list[int] = []     # cache ids to drop before the next command

    def release(self, cid: int) -> None:
        self.released.append(cid)

    def command(self, cmd: dict):
        """Run cmd on every rank; the full logits of a forward op, else None."""
        if self.released:
            drop, self.released = self.released, []
            self.command({"op": "drop_caches", "ids": drop})
        if cmd["op"] in COLLECTIVE_OPS:
            parts = self.group.run([lambda r=r: r.run(cmd) for r in self.runners])
            return join_logits(parts, self.plan, cmd)
        for r in self.runners:      # no collectives inside: one rank after the other
            r.run(cmd)
        return None

    def close(self) -> None:
        """Nothing to stop: the ranks' threads live for one command each."""
