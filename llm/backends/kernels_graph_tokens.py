"""The decode loops of llm/backends/kernels_graph.py's GraphRunner that keep each step's
token on the device: greedy (the argmax kernel's pick) and sampled (stdlib's sampler with
uniforms uploaded at once) token streams, each step a replay of the cache's decode graph.

Input: the GraphRunner (a `DeviceTokens` subclass: its decode_step, _graph_key and backend), a
first token, its position, a KV cache and a token count. Output: the tokens, yielded on the
host while later steps already run on the device.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

import pykernel as pk
from llm.sampling import check_device_picks


class DeviceTokens:
    """Token streams of decode graphs whose picks stay on the device (mixed into GraphRunner,
    which provides decode_step(token, pos, cache, sampling), _graph_key(pos, sampling) and
    backend)."""

    def greedy(self, first_token: int, pos: int, cache, n: int) -> list[int]:
        """n greedy tokens after `first_token` at `pos` (greedy_tokens, all of them)."""
        return list(self.greedy_tokens(first_token, pos, cache, n))

    def greedy_tokens(self, first_token: int, pos: int, cache, n: int) -> Iterator[int]:
        """Up to n greedy tokens after `first_token` at `pos`, each yielded once on the host;
        step k runs at position pos + k. The argmax kernel feeds each step's token to the
        next one on the device, so on cuda step i + 1 is queued before the host reads token
        i (a 4-byte asynchronous copy into pinned memory): the GPU never waits for the host,
        nor for the consumer of the tokens. A consumer that stops early leaves one step run
        past the last token it read (its K/V written one position beyond: harmless, a later
        step overwrites it); closing waits for the steps in flight. A step whose logits have
        no finite value (broken weights) picks -1, read here as NonFiniteLogitsError (the
        step queued behind it embeds a NaN row, never out of range)."""
        return self._device_tokens(first_token, pos, cache, n, None)

    def sampled_tokens(self, first_token: int, pos: int, cache, n: int, params,
                       uniforms) -> Iterator[int]:
        """greedy_tokens with stdlib's sampler drawing each step's token on the device
        (params' top-k, top-p, min-p and temperature; no penalties): step k draws with
        uniforms[k], which go to the device at once, so the steps run ahead of the host as
        greedy ones do. One decode graph per filter setting."""
        if n > 0:
            table = self._uniforms(cache)[0]
            table[pos:pos + n].copy_from(np.asarray(uniforms[:n], np.float32))
        return self._device_tokens(first_token, pos, cache, n, params)

    def _device_tokens(self, first_token: int, pos: int, cache, n: int, sampling):
        if n <= 0:
            return
        self.decode_step(first_token, pos, cache, sampling)
        io, vocab = cache.graph.io, cache.graph.logits.shape[-1]
        known = _picked(io[0:1].numpy(), vocab)   # the token of the step at pos, not yielded
        if self.backend.device.kind != "cuda":
            for i in range(1, n):
                yield known
                self._replay_or_capture(known, pos + i, cache, sampling)
                known = _picked(io[0:1].numpy(), vocab)
            yield known
            return
        slots = [pk.pinned_empty(1, np.int32) for _ in range(2)]
        events = [pk.Event(), pk.Event()]
        stream = self.backend.stream
        pending = None   # the step whose token is in flight to the host
        try:
            for i in range(1, n):
                step = cache.graphs.get(self._graph_key(pos + i, sampling))
                if step is None:   # first step past short_context: drain, capture synchronously
                    if pending is not None:
                        known, pending = self._read(slots, events, pending, vocab), None
                    yield known
                    self.decode_step(known, pos + i, cache, sampling)
                    known = _picked(io[0:1].numpy(), vocab)
                    continue
                step.graph.replay(stream)
                io[0:1].copy_to_host_async(slots[i % 2], stream)
                events[i % 2].record(stream)
                if pending is None:
                    yield known
                else:
                    yield self._read(slots, events, pending, vocab)
                pending = i
            yield known if pending is None else self._read(slots, events, pending, vocab)
            pending = None
        finally:
            if pending is not None:     # copies into slots still in flight
                stream.synchronize()

    @staticmethod
    def _read(slots, events, i: int, vocab: int) -> int:
        events[i % 2].synchronize()
        return _picked(slots[i % 2], vocab)

    def _replay_or_capture(self, token: int, pos: int, cache, sampling=None) -> None:
        step = cache.graphs.get(self._graph_key(pos, sampling))
        if step is None:
            self.decode_step(token, pos, cache, sampling)
        else:
            step.graph.replay()

    def _uniforms(self, cache) -> tuple:
        """(a uniform per position, the step's uniform) on the device, made on the first
        sampled step of the cache (before its capture)."""
        if cache.uniforms is None:
            cache.uniforms = (pk.zeros(cache.n_ctx, np.float32), pk.zeros(1, np.float32))
        return cache.uniforms


def _picked(io_token, vocab: int) -> int:
    """The token a decode step picked on the device (its io[0], on the host); -1, a row
    without a finite logit, is NonFiniteLogitsError (a comparison per token, no numpy)."""
    token = int(io_token[0])
    if 0 <= token < vocab:
        return token
    return int(check_device_picks([token], vocab)[0])     # raises
