"""Next-token choice: logits (n_vocab,) + recent tokens -> one token id.

The chain follows llama.cpp's default order: repetition/frequency/presence penalties over the
last `repeat_last_n` tokens -> top-k -> top-p (nucleus, on temperature-1 probabilities) -> min-p
-> temperature -> a draw from the seeded generator. `temperature <= 0` is greedy (argmax after
the penalties). The same seed and inputs give the same tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40              # <= 0: off
    top_p: float = 0.95          # >= 1: off
    min_p: float = 0.05          # <= 0: off
    repeat_penalty: float = 1.0  # 1: off; > 1 discourages tokens seen in the window
    repeat_last_n: int = 64      # penalty window; -1: the whole history, 0: off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None      # None: fresh entropy

    def validate(self) -> None:
        checks = [
            (self.temperature >= 0, "temperature must be >= 0"),
            (self.top_p > 0, "top_p must be > 0 (>= 1 turns it off)"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (self.repeat_penalty > 0, "repeat_penalty must be > 0"),
            (self.repeat_last_n >= -1, "repeat_last_n must be >= -1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"invalid sampling parameter: {message}")


def apply_penalties(logits: np.ndarray, history: Sequence[int], p: SamplingParams) -> np.ndarray:
    """logits with llama.cpp's penalties for tokens in the last-n window: a copy where a
    penalty applies, else logits itself as float32 (no copy of a 128k-entry row per token)."""
    logits = np.asarray(logits, dtype=np.float32)
    if p.repeat_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0:
        return logits
    window = list(history) if p.repeat_last_n == -1 else list(history)[-p.repeat_last_n:]
    if p.repeat_last_n == 0 or not window:
        return logits
    logits = logits.copy()
    ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
    chosen = logits[ids]
    chosen = np.where(chosen > 0, chosen / p.repeat_penalty, chosen * p.repeat_penalty)
    chosen -= counts * np.float32(p.frequency_penalty) + np.float32(p.presence_penalty)
    logits[ids] = chosen
    return logits


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


# Sampler.candidate_k: the largest top_k whose candidates a backend sends instead of the row
CANDIDATE_K_MAX = 256
# top_k_ids: every SAMPLE_STRIDE-th logit estimates a threshold when k is this small a share
SAMPLE_STRIDE = 32


def top_k_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest logits (0 < k < len(logits)), in no order (NaN never among them).
    A threshold from a strided sample (its (k / stride + 4)-th largest) usually leaves a few
    hundred logits at or above it, and the k largest are among them whenever at least k are:
    partitioning those instead of the whole row takes ~0.1 ms instead of ~0.35 on a 128k
    vocabulary. Rows where the sample misleads (fewer than k left) take the full partition."""
    sample = logits[::SAMPLE_STRIDE]
    rank = k // SAMPLE_STRIDE + 4
    if rank < sample.shape[0] // 4:
        threshold = np.partition(sample, sample.shape[0] - rank)[sample.shape[0] - rank]
        above = np.flatnonzero(logits >= threshold)
        if above.shape[0] >= k:
            return above[np.argpartition(-logits[above], k - 1)[:k]]
    return np.argpartition(-logits, k - 1)[:k]


def candidates(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, probabilities) left after top-k, top-p and min-p and the temperature, most
    likely first. Assumes temperature > 0."""
    n = logits.shape[0]
    if 0 < p.top_k < n:
        ids = top_k_ids(logits, p.top_k)
    else:
        ids = np.arange(n)
    ids = ids[np.argsort(-logits[ids], kind="stable")]
    kept = logits[ids].astype(np.float64)
    if p.top_p < 1.0:
        probs = _softmax(kept)
        keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)  # first prefix with mass >= p
        ids, kept = ids[:keep], kept[:keep]
    if p.min_p > 0.0:
        keep = kept >= kept[0] + np.log(p.min_p)  # prob >= min_p * max prob
        ids, kept = ids[keep], kept[keep]
    return ids, _softmax(kept / p.temperature)


class Sampler:
    def __init__(self, params: SamplingParams | None = None):
        self.params = params or SamplingParams()
        self.params.validate()
        self.rng = np.random.default_rng(self.params.seed)

    @property
    def _penalised(self) -> bool:
        p = self.params
        return p.repeat_last_n != 0 and (p.repeat_penalty != 1.0 or p.presence_penalty != 0.0
                                         or p.frequency_penalty != 0.0)

    @property
    def plain_argmax(self) -> bool:
        """Greedy with no penalty in effect: the token is the logits' argmax alone, which a
        backend may take on its device (Backend.argmax_rows) without copying the logits."""
        return self.params.temperature <= 0 and not self._penalised

    @property
    def candidate_k(self) -> int:
        """k such that a row's k largest logits alone decide the token (1 when plain greedy,
        else top_k up to CANDIDATE_K_MAX with no penalty in effect), so that a backend may
        send only its largest logits (Backend.top_candidates, sample_among); 0 when the whole
        row is needed."""
        if self.plain_argmax:
            return 1
        k = self.params.top_k
        if self.params.temperature > 0 and not self._penalised and 0 < k <= CANDIDATE_K_MAX:
            return k
        return 0

    def sample_among(self, values: np.ndarray, ids: np.ndarray) -> int:
        """The token `sample` picks from a row whose largest logits (candidate_k of them at
        least, every logit equal to the smallest of those included) are `values` at `ids`:
        the same filters and one draw from the same generator, so the same token for a seed
        (unless logits tie at the top-k cut, where either pick is top-k's)."""
        if self.params.temperature <= 0:
            return int(ids[values == values.max()].min())     # argmax: lowest index on ties
        local, probs = candidates(np.asarray(values, np.float32), self.params)
        return int(ids[local[self.rng.choice(len(local), p=probs)]])

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        logits = apply_penalties(logits, history, self.params)
        if self.params.temperature <= 0:
            return int(np.argmax(logits))
        ids, probs = candidates(logits, self.params)
        return int(ids[self.rng.choice(len(ids), p=probs)])
