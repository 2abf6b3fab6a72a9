"""The kernels backend's ops that end a forward: rows picked from the logits, greedy ids,
candidates and samples, and the copies to the host (KernelsBackend mixes these in; they use its
`materialize`, `device_ints`, `arena` and `readback` (logits_readback.LogitsReadback))."""
from __future__ import annotations

import numpy as np

from stdlib_kernels import embedding as embedding_rows


class ReadbackOps:
    def rows(self, x, indices):
        """x's rows `indices` gathered (host ints, or a device array: a prefill graph's index
        of the prompt's last row)."""
        x = self.materialize(x)
        index = self.device_ints(indices)
        return embedding_rows(x, index, out=self.arena.take((index.shape[0], x.shape[1]),
                                                            np.float32))

    def argmax_rows(self, x):
        return self.readback.argmax_rows(self.materialize(x))

    def top_candidates(self, x, k):
        return self.readback.top_candidates(self.materialize(x), k)

    def sample_rows(self, x, samplers, histories):
        return self.readback.sample_rows(self.materialize(x), samplers, histories)

    def logits_rows(self, x, indices):
        return self.readback.pick(self.materialize(x), indices)

    def last_row(self, x):
        x = self.materialize(x)
        return x[x.shape[0] - 1:]

    def to_host(self, x):
        return self.materialize(x).numpy()

    def to_host_reused(self, x):
        return self.readback.rows(self.materialize(x))

