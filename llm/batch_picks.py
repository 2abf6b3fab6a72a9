"""How a batched decode step's tokens are picked (llm/batching.py's BatchScheduler).

Input: the backend, the step's generations (one per logits row, in row order) and the step's
logits (on the device where the backend keeps them). Output: per row, a pick (a token, a
candidate list to sample on the host, or the row's NonFiniteLogitsError) or a host copy of
the row to sample from.
"""
from __future__ import annotations

from llm.generate import Generation
from llm.sampling import NonFiniteLogitsError

# the fewest rows a step's tokens are drawn on the device for (Backend.sample_rows); a lone
# row's candidate list drawn on the host was ~0.1 ms a step quicker on an H100's host
# (benchmarks/RESULTS.md, "Sampled server steps drawn on the device")
DEVICE_DRAW_ROWS = 2


def step_picks(backend, gens: list[Generation], logits) -> tuple[list, list]:
    """(picks, host rows) of a step's logits, one each per generation of the step (its
    requests, in row order), so that the logits stay on the device where the requests allow.
    Each request's row goes the cheapest way it allows, and a step's rows may go different
    ways:
    - every request plain greedy (no penalty, no logprobs): the backend's argmax_rows
      (16 ids copied instead of 8 MB of logits rows);
    - greedy or an unseeded top-k sampler, penalties or not (Sampler.device_row_draws),
      when two or more such rows (or one with penalties) are in the step: drawn on the
      device (Backend.sample_rows: the host's sampling phase, ~1 ms a 16-row step on an
      H100's host, leaves the step's critical path, and penalised rows are not copied
      whole); the pick is the token;
    - greedy or top-k with no penalty (Sampler.candidate_k): the row's largest logits
      (Backend.top_candidates, a few hundred values a row); the pick is that list,
      sampled on the host for all such rows in one pass (sample_among_rows);
    - otherwise (a seed with top-k off, logprobs wanted, a list that overflowed): the
      row is copied to the host (rows) and sampled there.
    A seeded request or one wanting logprobs thus takes only its own row off the
    device path, not the whole step's. A row the device (or the host's argmax) could not
    pick from gets its NonFiniteLogitsError as its pick: that request alone fails."""
    n = len(gens)
    wanted = [g.sampler.candidate_k if g.logprobs is None else 0 for g in gens]
    if all(k == 1 for k in wanted):
        return row_picks(backend.argmax_rows, logits), [None] * n
    picks: list = [None] * n
    rows: list = [None] * n

    def part(indices: list):
        return logits if len(indices) == n else backend.logits_rows(logits, indices)

    on_device = backend.logits_on_device    # (a host backend's rows: nothing to gather)
    drawable = [i for i, g in enumerate(gens) if on_device
                and g.logprobs is None and g.sampler.device_row_draws]
    if len(drawable) >= DEVICE_DRAW_ROWS or any(wanted[i] == 0 for i in drawable):
        tokens = row_picks(backend.sample_rows, part(drawable),
                            [gens[i].sampler for i in drawable],
                            [gens[i].history for i in drawable])
        if tokens is not None:
            for i, token in zip(drawable, tokens):
                picks[i] = token
    listed = [i for i in range(n) if on_device and picks[i] is None and wanted[i]]
    if listed:
        lists = backend.top_candidates(part(listed), max(wanted[i] for i in listed))
        for i, candidates in zip(listed, lists or ()):
            picks[i] = candidates          # (None where the list overflowed)
    whole = [i for i in range(n) if picks[i] is None]
    if whole:
        host = (backend.to_host(logits)[-1:] if n == 1 else
                backend.to_host_reused(part(whole)))
        for i, row in zip(whole, host):
            rows[i] = row
    return picks, rows


def row_picks(pick, *args) -> list | None:
    """pick(*args)'s tokens for a step's rows (host ints; None where it gives none), with each
    row that had nothing to pick from (NonFiniteLogitsError naming it) holding its own error,
    so that that request alone fails (BatchScheduler._advance raises it) and the others go on."""
    try:
        tokens = pick(*args)
    except NonFiniteLogitsError as exc:
        if exc.picks is None or not exc.rows:
            raise
        return [exc.rows.get(r, int(t)) for r, t in enumerate(exc.picks)]
    return None if tokens is None else [int(t) for t in tokens]
