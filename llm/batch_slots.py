"""The slots of llm/batching.py's BatchScheduler: copying a slot's cache into another, and
grouping admitted prompts into forward passes.

Input: the scheduler's sessions (one per slot; each a KV cache and the token ids it holds),
its spare cache and the admitted requests. Output: caches and ids moved between slots; the
groups of requests whose prompts run together.
"""
from __future__ import annotations


def common_prefix(tokens, ids) -> int:
    """How many leading tokens the two id lists share."""
    n = 0
    for a, b in zip(tokens, ids):
        if a != b:
            break
        n += 1
    return n


def move_slot(sessions: list, source: int, target: int) -> None:
    """Slot source's cache and ids into slot target (source keeps its copy)."""
    src, dst = sessions[source], sessions[target]
    dst.cache.copy_from(src.cache, len(src.tokens))
    dst.tokens = list(src.tokens)


def trade_slots(sessions: list, spare, freed: int, last: int) -> None:
    """The running request's cache in slot last into slot freed, and freed's finished
    history (kept in the spare cache meanwhile) into slot last."""
    history = list(sessions[freed].tokens)
    if history:
        spare.copy_from(sessions[freed].cache, len(history))
    move_slot(sessions, last, freed)
    kept = sessions[last]
    if history:
        kept.cache.copy_from(spare, len(history))
    kept.tokens = history


def prompt_groups(sessions: list, admitted: list, budget: int) -> list[tuple[list, int]]:
    """The admitted requests in groups whose prompts run in one forward pass
    (`prefill_together`), each with its new tokens: consecutive ones whose new tokens
    (after what their slots reuse) fit one prefill step of `budget` tokens together; a prompt
    scored token by token (echo with logprobs), or one longer than a step, alone."""
    groups: list[tuple[list, int]] = []
    for request in admitted:
        session = sessions[request.slot]
        try:
            new = len(request.ids) - session.reusable(request.ids)
        except ValueError:               # fails again in the request's own group
            new = budget + 1
        alone = request.prompt_logprobs or new > budget
        if alone or not groups or groups[-1][1] + new > budget:
            groups.append(([request], budget + 1 if alone else new))
        else:
            groups[-1] = (groups[-1][0] + [request], groups[-1][1] + new)
    return groups
