"""What a step's logits send to the host on the kernels backend: whole rows into one
page-locked buffer, the rows' greedy ids, their sampled ids (drawn on the device), or each
row's largest logits (top-k candidate lists), each into buffers kept between steps.

Input: f32 device arrays (rows, vocab). Output: host numpy arrays, views of buffers that the
next call of the same kind overwrites (the scheduler samples a step's rows at once).
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from llm.sampling import check_device_picks, penalty_window
from stdlib_kernels import embedding as embedding_rows
from stdlib_kernels.sampling import (apply_penalties_rows, argmax, lists_k, row_settings,
                                     sample_rows, top_k_candidates)

# top_candidates: room for each row's largest logits (top-k's bin and those above it: a few
# hundred on real rows; more, and that row's logits are copied whole)
CANDIDATES_CAP = 1024


class LogitsReadback:
    def __init__(self, device):
        self.device = device
        self._rows = None          # rows' page-locked buffer (cuda)
        self._ids = None           # argmax_rows' device ids
        self._lists = None         # top_candidates' device lists: ids, values, counts
        self._lists_host = None    # and their page-locked copy (cuda)
        self._staged = {}          # sample_rows' uploads: name -> (page-locked, device)
        self._picked = None        # pick's rows

    def rows(self, x) -> np.ndarray:
        """x whole; on a GPU into one page-locked buffer: 16 rows of a 128k vocabulary's
        logits took 1.42 ms a step into pageable memory on an H100 (benchmarks/RESULTS.md
        "Batched decode: attention splits for the whole batch, ...")."""
        if self.device.kind != "cuda":
            return x.numpy()
        if self._rows is None or self._rows.size < x.size:
            self._rows = pk.pinned_empty(x.size, np.float32, self.device)
        return x.numpy(out=self._rows[:x.size].reshape(x.shape))

    def pick(self, x, indices) -> "pk.Array":
        """x's rows at indices, copied into a buffer of this readback's own (not the step's
        activation arena, whose slots the captured steps' graphs use), for a step whose rows
        are read back in different ways; valid until the next pick."""
        rows, width = len(indices), x.shape[1]
        if self._picked is None or self._picked.size < rows * width:
            self._picked = pk.empty(rows * width, np.float32)
        index = self._upload("picked", np.asarray(indices, np.int32))
        return embedding_rows(x, index, out=self._picked[:rows * width].reshape(rows, width))

    def argmax_rows(self, x) -> np.ndarray:
        """Each row's argmax on the device, the ids alone copied (an all-NaN row:
        NonFiniteLogitsError)."""
        return self._ids_of(argmax(x, out=self._ids_buffer(x.shape[0])), x.shape[1])

    def sample_rows(self, x, samplers, histories) -> np.ndarray:
        """Each row's token drawn on the device by stdlib's sample_rows with its sampler's
        filters and one uniform from its sampler's generator (none for a greedy one), after
        its penalties over its history's window (apply_penalties_rows, in place on x, when
        any sampler has them); the ids alone copied. Settings and windows go up
        asynchronously from page-locked memory, so the launches queue behind the step still
        running instead of waiting for it (the buffers are rewritten only after this call's
        ids, queued after the copies, came back)."""
        rows, vocab = x.shape
        params = [s.params for s in samplers]
        windows = [penalty_window(h, p) for h, p in zip(histories, params)]
        if any(windows):
            ids = np.full((rows, max(len(w) for w in windows)), -1, np.int32)
            for r, window in enumerate(windows):
                ids[r, :len(window)] = window
            penalties = np.array([(p.repeat_penalty, p.presence_penalty, p.frequency_penalty)
                                  for p in params], np.float32)
            apply_penalties_rows(x, self._upload("windows", ids),
                                 self._upload("penalties", penalties))
        uniforms = [s.rng.random() if p.temperature > 0 else 0.0
                    for s, p in zip(samplers, params)]
        settings = row_settings(uniforms, temperature=[p.temperature for p in params],
                                top_k=[p.top_k for p in params],
                                top_p=[p.top_p for p in params],
                                min_p=[p.min_p for p in params])
        drawn = sample_rows(x, self._upload("settings", settings), k=lists_k(settings, vocab),
                            out=self._ids_buffer(rows))
        return self._ids_of(drawn, vocab)

    def _upload(self, name: str, values: np.ndarray):
        """values on the device, copied asynchronously through a page-locked buffer kept per
        name (grown on demand): the device view of its first values.size elements."""
        staged = self._staged.get(name)
        if staged is None or staged[0].size < values.size:
            size = max(values.size, 1024)
            staged = self._staged[name] = (pk.pinned_empty(size, values.dtype, self.device),
                                           pk.empty(size, values.dtype))
        host = staged[0][:values.size].reshape(values.shape)
        host[...] = values
        return staged[1][:values.size].reshape(values.shape).copy_from_host_async(host)

    def _ids_buffer(self, rows: int):
        if self._ids is None or self._ids.size < rows:
            self._ids = pk.empty(max(rows, 16), np.int32)
        return self._ids[:rows]

    @staticmethod
    def _ids_of(ids, vocab: int) -> np.ndarray:
        """The ids on the host; a row the kernels could not pick from is
        NonFiniteLogitsError, as on the host backends (check_device_picks)."""
        return check_device_picks(ids.numpy(), vocab)

    def top_candidates(self, x, k: int) -> list:
        """Per row (values, ids) of its k largest logits and their bin, or None where the list
        overflowed. One launch pair and one copy: the lists' ids, values and counts share one
        device buffer, read back into one page-locked buffer."""
        rows, cap = x.shape[0], CANDIDATES_CAP
        words = rows * (2 * cap + 1)
        if self._lists is None or self._lists.size < words:
            self._lists = pk.empty(max(words, 16 * (2 * cap + 1)), np.int32)
            self._lists_host = (pk.pinned_empty(self._lists.size, np.int32)
                                if self.device.kind == "cuda" else None)
        buf = self._lists[:words]
        ids = buf[:rows * cap].reshape(rows, cap)
        values = buf[rows * cap:2 * rows * cap].view(np.float32).reshape(rows, cap)
        top_k_candidates(x, k, cap=cap, values=values, ids=ids, counts=buf[2 * rows * cap:])
        host = buf.numpy(out=None if self._lists_host is None else self._lists_host[:words])
        ids = host[:rows * cap].reshape(rows, cap)
        values = host[rows * cap:2 * rows * cap].view(np.float32).reshape(rows, cap)
        return [(values[r, :c], ids[r, :c]) if c <= cap else None
                for r, c in enumerate(host[2 * rows * cap:])]
