"""Next-token choice: logits (n_vocab,) + recent tokens -> one token id.

The chain follows llama.cpp's default order: repetition/frequency/presence penalties over the
last `repeat_last_n` tokens -> top-k -> top-p (nucleus, on temperature-1 probabilities) -> min-p
-> temperature -> a draw from the seeded generator. `temperature <= 0` is greedy (argmax after
the penalties). The same seed and inputs give the same tokens. A row whose largest logit is NaN
or +Inf, or that holds nothing but -Inf (broken weights or hyperparameters), raises
`NonFiniteLogitsError` instead of picking a meaningless token.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


class NonFiniteLogitsError(RuntimeError):
    """The model produced logits no token can be drawn from (NaN, +Inf, or every logit -Inf):
    its weights or hyperparameters are broken. Raised per request, never a crash.

    A check of several rows (a batch of requests' step) also says which: `rows` maps each
    failing row to its own one-row error, and `picks`, where the check made them, holds every
    row's token (host ints; the failing rows' meaningless), so that a batch can fail those
    rows' requests alone and go on with the others (llm/batching.py)."""

    def __init__(self, message: str, rows: dict | None = None, picks=None):
        super().__init__(message)
        self.rows = rows or {}
        self.picks = picks


def check_finite_logits(logits: np.ndarray, picks=None) -> None:
    """NonFiniteLogitsError unless each row's largest logit is finite (-Inf entries are
    fine: masked tokens). np.max propagates NaN, so one reduction per row checks it all.
    picks: the rows' tokens, carried by the error (NonFiniteLogitsError.picks)."""
    top = np.asarray(np.max(np.asarray(logits), axis=-1)).reshape(-1)
    if not np.isfinite(top).all():
        rows = {int(r): NonFiniteLogitsError(_non_finite_message(top[r:r + 1]))
                for r in np.flatnonzero(~np.isfinite(top))}
        raise NonFiniteLogitsError(_non_finite_message(top), rows, picks)


def check_device_picks(ids, vocab: int) -> np.ndarray:
    """Token ids a device picked (host ints), checked: an id outside [0, vocab) marks a row
    the kernels could not pick from (no finite largest logit: stdlib's argmax gives 2**31 - 1
    on an all-NaN row, its samplers and the decode graph's argmax -1), which is
    NonFiniteLogitsError, as the host's check_finite_logits makes it."""
    ids = np.asarray(ids).astype(np.int64).reshape(-1)
    bad = (ids < 0) | (ids >= vocab)
    if bad.any():
        rows = {int(r): NonFiniteLogitsError(_no_pick_message(1, 1))
                for r in np.flatnonzero(bad)}
        raise NonFiniteLogitsError(_no_pick_message(int(bad.sum()), ids.size), rows, ids)
    return ids


def _no_pick_message(bad: int, rows: int) -> str:
    where = f" in {bad} of {rows} rows" if rows > 1 else ""
    return (f"the model produced logits with no finite value{where}: its weights are broken "
            f"(a corrupt model file?)")


def _non_finite_message(top: np.ndarray) -> str:
    bad = top[~np.isfinite(top)]
    what = ("NaN" if np.isnan(bad).any() else "+Inf" if (bad > 0).any()
            else "only -Inf (or no candidate)")
    rows = f" in {bad.size} of {top.size} rows" if top.size > 1 else ""
    return (f"the model produced logits with {what}{rows}: its weights are broken (a corrupt "
            f"model file?)")


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


def penalty_window(history: Sequence[int], p: SamplingParams) -> list:
    """The ids whose penalties apply next: the last repeat_last_n of history (-1: all of
    it); empty when no penalty is in effect."""
    if p.repeat_last_n == 0 or (p.repeat_penalty == 1.0 and p.presence_penalty == 0.0
                                and p.frequency_penalty == 0.0):
        return []
    # slice before copying: this runs every step, and a history grows with the context
    return list(history) if p.repeat_last_n == -1 else list(history[-p.repeat_last_n:])


def apply_penalties(logits: np.ndarray, history: Sequence[int], p: SamplingParams) -> np.ndarray:
    """logits with llama.cpp's penalties for tokens in the last-n window: a copy where a
    penalty applies, else logits itself as float32 (no copy of a 128k-entry row per token)."""
    logits = np.asarray(logits, dtype=np.float32)
    window = penalty_window(history, p)
    if not window:
        return logits
    logits = logits.copy()
    ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
    chosen = logits[ids]
    chosen = np.where(chosen > 0, chosen / p.repeat_penalty, chosen * p.repeat_penalty)
    chosen -= counts * np.float32(p.frequency_penalty) + np.float32(p.presence_penalty)
    logits[ids] = chosen
    return logits


# Sampler.candidate_k: the largest top_k whose candidates a backend sends instead of the row
CANDIDATE_K_MAX = 256
# top_k_ids: every SAMPLE_STRIDE-th logit estimates a threshold when k is this small a share
SAMPLE_STRIDE = 32


def _k_largest(ids: np.ndarray, values: np.ndarray, k: int) -> np.ndarray:
    """The k of ids with the largest values, the lowest ids first among equal values (so the
    cut through a tie is the same whatever superset of the k largest comes in)."""
    return ids[np.lexsort((ids, -values))[:k]]


def top_k_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest logits (0 < k < len(logits)), the lowest ids among logits tied at
    the cut, in no order (NaN never among them). A threshold from a strided sample (its
    (k / stride + 4)-th largest) usually leaves a few hundred logits at or above it, and the k
    largest are among them whenever at least k are: sorting those instead of partitioning the
    whole row takes ~0.1 ms instead of ~0.35 on a 128k vocabulary. Rows where the sample
    misleads (fewer than k left) take the full partition."""
    sample = logits[::SAMPLE_STRIDE]
    rank = k // SAMPLE_STRIDE + 4
    if rank < sample.shape[0] // 4:
        threshold = np.partition(sample, sample.shape[0] - rank)[sample.shape[0] - rank]
        above = np.flatnonzero(logits >= threshold)
        if above.shape[0] >= k:
            return _k_largest(above, logits[above], k)
    kth = -np.partition(-logits, k - 1)[k - 1]
    above = np.flatnonzero(logits >= kth)          # the k largest and every tie of the k-th
    return _k_largest(above, logits[above], k)


def _padded(lists) -> tuple[np.ndarray, np.ndarray]:
    """(values (R, L) f32, NaN-padded; ids (R, L) int64) of R (values, ids) lists."""
    width = max(len(v) for v, _ in lists)
    values = np.full((len(lists), width), np.nan, np.float32)
    ids = np.zeros((len(lists), width), np.int64)
    for r, (v, i) in enumerate(lists):
        values[r, :len(v)], ids[r, :len(i)] = v, i
    return values, ids


def _cumulative(w: np.ndarray) -> np.ndarray:
    """Row-wise running sums, left to right: also the sums (last column), so that trailing
    zeros (padding) leave every result unchanged, unlike numpy's pairwise sum."""
    return np.cumsum(w, axis=-1)


def filter_rows(values: np.ndarray, ids: np.ndarray, params: Sequence[SamplingParams],
                ids_ascending: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sampler chain after the penalties, row by row, on candidate lists: values (R, L)
    f32 (NaN never kept: padding) at ids (R, L). Each row must hold its row's top_k largest
    logits with every logit tied with the k-th (top_k on), or the whole row. Returns (ids,
    probabilities (R, L) float64): each row sorted by logit (the lowest id first among equal
    ones), the probabilities after top-k, top-p (on temperature-1 probabilities of the top-k
    survivors), min-p and the temperature, 0 where filtered out, and how many each row keeps
    (a prefix). Temperatures must be > 0. ids_ascending: each row's ids rise (a whole row),
    so a stable sort by logit alone gives the order (~2x faster than lexsort there)."""
    x = values.astype(np.float64)
    blank = np.isnan(x)
    count = x.shape[1] - blank.sum(axis=-1)
    x[blank] = -np.inf
    order = (np.argsort(-x, axis=-1, kind="stable") if ids_ascending else
             np.lexsort((ids, -x), axis=-1))
    x, ids = np.take_along_axis(x, order, -1), np.take_along_axis(ids, order, -1)
    check_finite_logits(x[:, :1])                    # an empty or NaN/+Inf row has no draw
    top_k, top_p, min_p, temperature = np.array(
        [(p.top_k, p.top_p, p.min_p, p.temperature) for p in params], np.float64).T
    position = np.arange(x.shape[1])
    keep = position < np.where((top_k > 0) & (top_k < count), top_k, count)[:, None]
    top = x[:, :1]                                   # each row's largest
    if (top_p < 1.0).any():
        e = np.where(keep, np.exp(x - top), 0.0)
        cum = _cumulative(e / _cumulative(e)[:, -1:])
        first_p = (cum < top_p[:, None]).sum(axis=-1) + 1  # first prefix of mass >= top_p
        keep &= (top_p >= 1.0)[:, None] | (position < first_p[:, None])
    if (min_p > 0.0).any():
        with np.errstate(divide="ignore"):
            floor = np.where(min_p > 0.0, top[:, 0] + np.log(np.maximum(min_p, 0.0)), -np.inf)
        keep &= x >= floor[:, None]                  # prob >= min_p * max prob
    x = x / temperature[:, None]
    e = np.where(keep, np.exp(x - x[:, :1]), 0.0)
    return ids, e / _cumulative(e)[:, -1:], keep.sum(axis=-1)


def draw_rows(ids: np.ndarray, probs: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Each row's pick for a uniform u in [0, 1): the first id whose cumulative probability
    (normalised to end at 1) exceeds u, exactly as numpy's Generator.choice(p=...) picks
    with the same uniform."""
    cdf = _cumulative(probs)
    cdf /= cdf[:, -1:]
    return ids[np.arange(len(ids)), (cdf <= np.asarray(uniforms)[:, None]).sum(axis=-1)]


def _draw_one(values: np.ndarray, ids: np.ndarray, p: SamplingParams, u: float) -> int:
    """filter_rows + draw_rows for one list (a sampler alone: the single-stream step), in
    fewer numpy calls (~2x faster on short lists): each filter cuts the sorted list to its
    kept prefix instead of masking, which leaves every sum and so every pick bit for bit
    those of the masked rows (their masked tails add zeros after the prefix)."""
    values = np.asarray(values, np.float32)
    ids = np.asarray(ids)
    if np.isnan(values).any():
        ids, values = ids[~np.isnan(values)], values[~np.isnan(values)]
    check_finite_logits(values if values.size else np.array([np.nan], np.float32))
    order = np.lexsort((ids, -values.astype(np.float64)))
    if 0 < p.top_k < len(order):
        order = order[:p.top_k]
    x, ids = values[order].astype(np.float64), ids[order]
    if p.top_p < 1.0:
        e = np.exp(x - x[0])
        cut = int((np.cumsum(e / np.cumsum(e)[-1]) < p.top_p).sum()) + 1
        x, ids = x[:cut], ids[:cut]
    if p.min_p > 0.0:
        kept = int((x >= x[0] + np.log(p.min_p)).sum())
        x, ids = x[:kept], ids[:kept]
    x = x / p.temperature
    e = np.exp(x - x[0])
    cdf = np.cumsum(e / np.cumsum(e)[-1])
    cdf /= cdf[-1]
    return int(ids[(cdf <= u).sum()])


def candidates(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, probabilities) left after top-k, top-p and min-p and the temperature, most
    likely first (the lowest id first among equal logits). Assumes temperature > 0."""
    n = logits.shape[0]
    if 0 < p.top_k < n:
        ids = top_k_ids(logits, p.top_k)
        ids, probs, kept = filter_rows(logits[ids][None], ids[None], [p])
    else:
        ids, probs, kept = filter_rows(logits[None], np.arange(n)[None], [p], True)
    return ids[0, :kept[0]], probs[0, :kept[0]]


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

    @property
    def device_draws(self) -> bool:
        """Unseeded, temperature > 0, no penalty in effect: a device may draw the tokens with
        its own sampler (stdlib sampling.sample: the same filters and distribution, its own
        draws), since no seed asks for the host's draws."""
        p = self.params
        return p.seed is None and p.temperature > 0 and not self._penalised

    @property
    def device_row_draws(self) -> bool:
        """Backend.sample_rows may draw this sampler's token on the device (a batched step's
        rows, or a lone penalised row): greedy (a seed changes nothing there), or unseeded
        with top-k on up to CANDIDATE_K_MAX; penalties or not (the device applies them
        first, over penalty_window)."""
        p = self.params
        return p.temperature <= 0 or (p.seed is None and 0 < p.top_k <= CANDIDATE_K_MAX)

    def sample_among(self, values: np.ndarray, ids: np.ndarray) -> int:
        """The token `sample` picks from a row whose largest logits (candidate_k of them at
        least, with every logit tied with the k-th) are `values` at `ids`: the same filters
        over the same survivors and one draw from the same generator, so the same token."""
        return sample_among_rows([self], [(values, ids)])[0]

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        logits = apply_penalties(logits, history, self.params)
        check_finite_logits(logits)
        if self.params.temperature <= 0:
            return int(np.argmax(logits))
        n, k = logits.shape[0], self.params.top_k
        if 0 < k < n:
            return self.sample_among(logits[ids := top_k_ids(logits, k)], ids)
        ids, probs, _ = filter_rows(logits[None], np.arange(n)[None], [self.params],
                                    ids_ascending=True)
        return int(draw_rows(ids, probs, [self.rng.random()])[0])


def _greedy_among(values: np.ndarray, ids: np.ndarray) -> int:
    """The lowest id among the largest of values (NaN entries are padding)."""
    real = ~np.isnan(values)
    check_finite_logits(values[real] if real.any() else np.array([np.nan], np.float32))
    return int(ids[real][values[real] == values[real].max()].min())


def sample_among_rows(samplers: Sequence[Sampler], lists: Sequence) -> list[int]:
    """One token per sampler from its row's candidate list (values, ids), as
    Sampler.sample_among gives it, for many rows at once (one pass of numpy over them all: a
    batched step's rows): a greedy sampler's is the largest logit (the lowest id on ties), the
    others' one draw each from their own generators."""
    tokens: list = [None] * len(samplers)
    drawn = []
    for r, (sampler, (values, ids)) in enumerate(zip(samplers, lists)):
        if sampler.params.temperature > 0:
            drawn.append(r)
        else:
            tokens[r] = _greedy_among(np.asarray(values), np.asarray(ids))
    if len(drawn) == 1:
        sampler = samplers[drawn[0]]
        tokens[drawn[0]] = _draw_one(*lists[drawn[0]], sampler.params, sampler.rng.random())
    elif drawn:
        values, ids = _padded([lists[r] for r in drawn])
        ids, probs, _ = filter_rows(values, ids, [samplers[r].params for r in drawn])
        uniforms = [samplers[r].rng.random() for r in drawn]
        for r, token in zip(drawn, draw_rows(ids, probs, uniforms)):
            tokens[r] = int(token)
    return tokens
