"""Decode steps as captured graphs: the one-token forward pass recorded once per KV cache and
replayed per token.

Input: a `Transformer` on the kernels backend, token ids and positions. Output: logits (device
array) of each step. The graph reads the token and its position from a 2-int device buffer
`io = [token, position]`, so a step is one 8-byte host-to-device copy, the replay, and the
caller's device-to-host copy; its last launch writes the greedy next token into io[0] and
advances io[1], so `greedy` decodes with no host-to-device copy at all and reads 4 bytes per
token. On the CPU target a "graph" is the recorded launch list (same code path, run in CI).
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from llm.backends import kernels_extra as X
from llm.models.transformer import Transformer


class DecodeGraph:
    def __init__(self, graph, logits, io):
        self.graph, self.logits, self.io = graph, logits, io


class GraphedTransformer(Transformer):
    """A Transformer whose forward runs on the kernels backend, with graph-replayed decode."""

    def __init__(self, inner: Transformer):
        self.__dict__.update(inner.__dict__)

    def forward(self, ids, start: int, cache, all_logits: bool = False):
        b = self.backend
        if len(ids) == 1 and not all_logits and b.use_graphs:
            return self.decode_step(int(ids[0]), start, cache)
        b.begin_step(ids, start)
        try:
            return b.materialize(super().forward(ids, start, cache, all_logits))
        finally:
            b.end_step()

    def _record(self, io, cache):
        """The device-input forward of one token plus the greedy pick; returns its logits."""
        b = self.backend
        b.begin_step([0], 0, device_io=io)
        try:
            logits = b.materialize(super().forward(np.zeros(1, np.int64), 0, cache))
            X.argmax_into(logits.reshape(-1), io, advance=True)
        finally:
            b.end_step()
        return logits

    def decode_step(self, token: int, pos: int, cache):
        """Logits (1, n_vocab) after `token` at position `pos` (written into the cache)."""
        step = cache.graph
        if step is not None:
            step.io.copy_from(np.array([token, pos], np.int32))
            step.graph.replay()
            return step.logits
        io = pk.to_device(np.array([token, pos], np.int32))
        logits = self._record(io, cache)   # runs the step: kernels compiled, buffers allocated
        with pk.capture_graph(self.backend.stream) as graph:
            self._record(io, cache)        # recorded, not run: the same launches and buffers
        cache.graph = DecodeGraph(graph, logits, io)
        return logits

    def greedy(self, first_token: int, pos: int, cache, n: int) -> list[int]:
        """n greedy tokens after `first_token` at `pos` (one 4-byte read per token)."""
        self.decode_step(first_token, pos, cache)
        step = cache.graph
        out = [int(step.io[0:1].numpy()[0])]
        for _ in range(n - 1):
            step.graph.replay()
            out.append(int(step.io[0:1].numpy()[0]))
        return out


def wrap(transformer: Transformer) -> GraphedTransformer:
    return GraphedTransformer(transformer)
