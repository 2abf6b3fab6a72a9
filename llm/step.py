"""One forward step as a value: what `Transformer.forward(step, caches)` runs, and what every
backend op that needs the step's inputs receives as an argument.

Input: token ids and their positions, the sequences they belong to (a first position and a row
count per sequence, the caches given beside the step), the rows whose logits are wanted, and the
attention plan. Output: a frozen `Step`. Ids and positions are host arrays (numpy) or device
arrays: a backend's `begin_forward` returns the step with them where its ops read them (the
kernels backend uploads both in one copy), and a captured graph's step carries slices of the
graph's device input buffer, so a replay reads new tokens without any host value changing.

Three kinds, which differ only in how attention maps rows to caches and which rows are kept:
    tokens   rows start..start+n-1 of one sequence (a prompt chunk, or one decode token)
    batch    one row per sequence, row i at positions[i] of cache i (batched decode)
    prompts  several prompts' rows one after the other, prompt i over cache i
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

KINDS = ("tokens", "batch", "prompts")
LAST = "last"       # Step.keep: the last row only (decode and prompt chunks)


@dataclass(frozen=True)
class Step:
    kind: str
    ids: Any                  # (n,) token ids: numpy ints, or a device int32 array
    positions: Any            # (n,) each row's position: numpy ints, or a device int32 array
    # each sequence's first position on the host; None where only the device knows them (a
    # graph replayed at every start reads them from positions)
    starts: tuple | None
    counts: tuple             # rows of each sequence, in the order their rows follow
    keep: Any = LAST          # rows whose logits the step returns: LAST, None (all), or indices
    #                           (numpy, or a device int32 array read by the gather)
    # the attention plan: decode attention in one split (short contexts, kernels backend), and
    # the batched decode's split count (None: planned from the lengths)
    direct: bool = False
    splits: int | None = None
    tables: Any = None        # a backend's per-step tables (kernels: prompt slots), begin_forward's

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown step kind {self.kind!r} (expected one of {KINDS})")

    @property
    def n(self) -> int:
        """Rows (tokens) in the step."""
        return int(self.ids.shape[0])

    @property
    def keeps_last(self) -> bool:
        """The step returns its last row's logits alone."""
        return isinstance(self.keep, str) and self.keep == LAST

    @property
    def on_host(self) -> bool:
        """Ids and positions are numpy arrays (not yet on a device)."""
        return isinstance(self.ids, np.ndarray)

    def with_inputs(self, ids, positions, **changes) -> Step:
        """This step reading ids and positions from other arrays (a backend's device copy)."""
        return replace(self, ids=ids, positions=positions, **changes)


def tokens(ids, start: int, all_logits: bool = False) -> Step:
    """Rows of one sequence at positions start..start+n-1; the last row's logits, or all."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    if ids.size == 0:
        raise ValueError("a step needs at least one token id")
    positions = np.arange(start, start + len(ids), dtype=np.int64)
    return Step("tokens", ids, positions, (int(start),), (len(ids),),
                keep=None if all_logits else LAST)


def batch(ids, positions, n_caches: int, splits: int | None = None) -> Step:
    """One new token per sequence: row i is ids[i] at positions[i] of the i-th cache; every
    row's logits."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    positions = np.asarray(positions, np.int64).reshape(-1)
    if not len(ids) == len(positions) == n_caches:
        raise ValueError(f"forward_batch: {len(ids)} ids, {len(positions)} positions and "
                         f"{n_caches} caches (one of each per sequence)")
    return Step("batch", ids, positions, tuple(int(p) for p in positions), (1,) * len(ids),
                keep=None, splits=splits)


def prompts(prompt_ids: list, starts: list, n_caches: int) -> Step:
    """Several prompts' tokens in one step, prompt i at positions starts[i].. of the i-th
    cache; each prompt's last row's logits."""
    if not len(prompt_ids) == len(starts) == n_caches or not all(len(p) for p in prompt_ids):
        raise ValueError(f"forward_prompts: {len(prompt_ids)} prompts (none empty), "
                         f"{len(starts)} starts and {n_caches} caches (one each)")
    ids, positions = prompt_rows(prompt_ids, starts)
    counts = tuple(len(p) for p in prompt_ids)
    return Step("prompts", ids, positions, tuple(int(s) for s in starts), counts,
                keep=np.cumsum(counts) - 1)


def prompt_rows(prompt_ids: list, starts: list) -> tuple[np.ndarray, np.ndarray]:
    """A prompts step's rows: every prompt's ids one after the other, and their positions."""
    ids = np.concatenate([np.asarray(p, np.int64).reshape(-1) for p in prompt_ids])
    positions = np.concatenate([np.arange(s, s + len(p), dtype=np.int64)
                                for p, s in zip(prompt_ids, starts)])
    return ids, positions
