"""A tensor-parallel rank's GraphRunner: the kernels backend's graphs, with the choices that
shape a step made by the group, not by each rank.

Input: a rank's Transformer on the kernels backend, and (once its first KV caches exist) its
Communicator. Output: `RankGraphRunner`, a GraphRunner whose prompt-graph limit
(prefill_graph_max: prompts of 2..limit tokens run padded to their bucket inside a captured
graph, longer ones eagerly at their length) is the smallest over the ranks.

Why: GraphRunner fits the limit to its own GPU's free memory (fitted_step), so two ranks with
different free memory (another process on one GPU, a replicated KV head) could run one prompt
as a padded bucket on one rank and at its length on the other; their all-reduces would then
sum different numbers of rows (an NCCL hang, or wrong sums). Every other choice a rank makes
about a step (graphs on or off, the quantized KV cache, the context length, the attention
splits of a step that names them) comes from the options and the step itself, which rank 0
sends to every rank alike.
"""
from __future__ import annotations

import gc

import numpy as np

from llm.backends.kernels_graph import GraphRunner


class RankGraphRunner(GraphRunner):
    """GraphRunner with `fitted_step` fixed to the group's value once `agree_on_shapes` ran."""

    agreed_step: int | None = None     # the group's prompt-graph limit (0: no prompt graphs)

    def fitted_step(self) -> int:
        if self.agreed_step is not None:
            return self.agreed_step
        return super().fitted_step()

    def agree_on_shapes(self, communicator) -> None:
        """The smallest prefill_graph_max over the ranks becomes every rank's (a collective:
        every rank calls it at the same command; only the first call exchanges)."""
        if self.agreed_step is not None:
            return
        mine = np.array([self.prefill_graph_max], np.int64)
        self.agreed_step = int(min(int(p[0]) for p in communicator.all_gather_host(mine)))

    def release_graphs(self) -> None:
        """Forget the batched decode graphs and collect the graphs no cache holds any more:
        NCCL waits for every graph that captured its collectives to be destroyed before it
        frees the communicator (ncclCommDestroy, NCCL >= 2.26)."""
        self.drop_batch_graphs()
        gc.collect()
