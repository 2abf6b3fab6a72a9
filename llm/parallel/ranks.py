"""One tensor-parallel rank's model, and the ranks of one process stepped together.

Input: commands (plain dicts, JSON-safe so that a GPU worker process can receive them over a
socket): build KV caches, copy one, drop some, and "forward": a `Step` as its wire dict
(`step_to_wire`: kind, global token ids, positions, starts, counts, kept rows, attention plan)
with its caches' ids. Output: each rank's logits columns as a host array padded to the widest
shard, which the driver (`llm.parallel.model`) cuts and concatenates in vocabulary order (or,
with pick "argmax", each row's largest logit among the rank's columns and its token id).

`RankRunner` is one rank: its transformer over its shard of the weights (a KV cache per cache id
for its heads), its backend with a `Communicator`. `LocalRanks` runs N of them in one process
through a `LocalGroup` (the CPU path); `llm.parallel.launch` runs one per GPU process.
"""
from __future__ import annotations

import numpy as np

from llm.parallel.communicator import LocalGroup
from llm.parallel.plan import RankShard, ShardPlan, local_token_ids, reduce_argmax
from llm.step import Step

COLLECTIVE_OPS = ("forward",)     # the commands every rank must run together (all-reduces)
# commands whose first run on a rank exchanges a value with the others (the prompt-graph
# limit, agree_on_shapes), so every rank runs them at once too; they return nothing
AGREEING_OPS = ("kv_caches",)


def step_to_wire(step: Step) -> dict:
    """A host step as JSON values for the ranks (global token ids)."""
    if not step.on_host or step.tables is not None:
        raise ValueError("a tensor-parallel step travels from the host: numpy ids and "
                         "positions, no backend tables (each rank's backend makes its own)")
    keep = step.keep if step.keeps_last or step.keep is None else _ints(step.keep)
    return {"kind": step.kind, "ids": _ints(step.ids), "positions": _ints(step.positions),
            "starts": None if step.starts is None else _ints(step.starts),
            "counts": _ints(step.counts), "keep": keep, "direct": bool(step.direct),
            "splits": None if step.splits is None else int(step.splits)}


def step_from_wire(wire: dict) -> Step:
    """step_to_wire's dict -> the Step (numpy int64 ids, positions and kept rows)."""
    keep = wire["keep"]
    if isinstance(keep, list):
        keep = np.asarray(keep, np.int64)
    starts = wire["starts"]
    return Step(wire["kind"], np.asarray(wire["ids"], np.int64),
                np.asarray(wire["positions"], np.int64),
                None if starts is None else tuple(starts), tuple(wire["counts"]), keep=keep,
                direct=wire["direct"], splits=wire["splits"])


def _ints(values) -> list[int]:
    return [int(v) for v in np.asarray(values).reshape(-1)]


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
            self._agree_on_shapes()
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
        logits = self.backend.to_host(self._forward(cmd))
        if cmd.get("pick") == "argmax":
            return self._row_maxima(logits)
        return self._padded(logits)

    def _agree_on_shapes(self) -> None:
        """Fix, with the other ranks, every per-rank choice that changes a step's rows (a
        prompt padded into its bucket graph, or run eagerly at its length): all ranks must
        make the same all-reduces. A collective, once the first KV caches exist (what the
        choice is measured against); a transformer without such choices has no
        agree_on_shapes (the same on every rank: one backend for all)."""
        agree = getattr(self.transformer, "agree_on_shapes", None)
        if agree is not None:
            agree(self.backend.communicator)

    def close(self) -> None:
        """Drop this rank's caches (they and the transformer hold its captured graphs, which
        NCCL waits for before it frees the communicator: release_graphs), then close the
        communicator."""
        self.caches.clear()
        release = getattr(self.transformer, "release_graphs", None)
        if release is not None:
            release()
        if self.backend.communicator is not None:
            self.backend.communicator.close()

    def _row_maxima(self, logits: np.ndarray) -> np.ndarray:
        """(2, n) float64: each row's largest logit among the rank's own columns and its
        global token id (the lowest on ties; exact in float64), for reduce_argmax."""
        own = np.where(np.isnan(logits[:, :self.shard.vocab.count]), -np.inf,
                       logits[:, :self.shard.vocab.count])
        best = own.argmax(axis=1)
        return np.stack([own[np.arange(len(own)), best], best + self.shard.vocab.first])

    def _forward(self, cmd: dict):
        """The command's step on this rank: the same rows and positions, its token ids mapped
        to rows of this rank's vocabulary shard (local_token_ids), its caches for its heads."""
        step = step_from_wire(cmd["step"])
        local = step.with_inputs(local_token_ids(step.ids, self.shard.vocab), step.positions)
        return self.transformer.forward(local, [self.caches[c] for c in cmd["caches"]])

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


class Ranks:
    """All ranks behind one call: command(cmd) runs cmd on every rank and returns the full
    logits of a forward op, else None; release(cid) queues a cache id that every rank drops
    before the next command. Subclasses say how a command reaches the ranks (run_on_ranks)."""

    def __init__(self):
        self.released: list[int] = []     # cache ids to drop before the next command

    def release(self, cid: int) -> None:
        self.released.append(cid)

    def command(self, cmd: dict):
        if self.released:
            drop, self.released = self.released, []
            self.run_on_ranks({"op": "drop_caches", "ids": drop})
        return self.run_on_ranks(cmd)

    def run_on_ranks(self, cmd: dict):
        raise NotImplementedError


class LocalRanks(Ranks):
    """N RankRunners in this process; forward commands run on N threads of a LocalGroup."""

    def __init__(self, runners: list[RankRunner], group: LocalGroup, plan: ShardPlan):
        super().__init__()
        self.runners, self.group, self.plan = runners, group, plan

    def run_on_ranks(self, cmd: dict):
        if cmd["op"] in COLLECTIVE_OPS:
            parts = self.group.run([lambda r=r: r.run(cmd) for r in self.runners])
            return join_logits(parts, self.plan, cmd)
        if cmd["op"] in AGREEING_OPS:
            self.group.run([lambda r=r: r.run(cmd) for r in self.runners])
            return None
        for r in self.runners:      # no collectives inside: one rank after the other
            r.run(cmd)
        return None

    def close(self) -> None:
        """Nothing to stop: the ranks' threads live for one command each."""
