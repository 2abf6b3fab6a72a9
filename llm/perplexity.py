"""Perplexity of a model over a text, as llama.cpp's `llama-perplexity` measures it (the usual
check of what a quantization costs).

Input: a loaded `llm.Model`, a text (or token ids) and a context `n_ctx`. Output:
`PerplexityResult` (perplexity, its uncertainty, tokens scored, the running estimate after
each chunk). The method is llama.cpp's: the tokens are cut into chunks of n_ctx; each chunk
runs from an empty cache, its first token replaced by BOS where the model adds one; only the
second half of each chunk is scored (every scored token then sees at least n_ctx / 2 tokens
before it), token j by the log-softmax of the logits at j - 1. PPL = exp(mean NLL), with the
uncertainty of that mean carried through the exp.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from llm.generate import ContextError, Session


@dataclass
class PerplexityResult:
    ppl: float
    ppl_error: float               # one standard error of the estimate
    mean_nll: float
    tokens_scored: int
    chunks: int
    n_ctx: int
    running: list = field(default_factory=list)   # the estimate after each chunk


def perplexity(model, text: str | Sequence[int], n_ctx: int = 512, max_chunks: int = 0,
               progress: Callable[[int, int, float], None] | None = None) -> PerplexityResult:
    """llama.cpp's perplexity of `model` over `text` in chunks of n_ctx tokens (max_chunks > 0:
    only the first ones). progress(chunk, chunks, estimate) after each chunk."""
    cfg = model.config
    if n_ctx < 4:
        raise ValueError(f"perplexity: a context of {n_ctx} tokens is too short (at least 4)")
    if n_ctx > model.n_ctx or (model.transformer.spec.learned_positions and
                               n_ctx > cfg.n_ctx_train):
        limit = min(model.n_ctx, cfg.n_ctx_train) if model.transformer.spec.learned_positions \
            else model.n_ctx
        raise ContextError(f"perplexity: chunks of {n_ctx} tokens exceed the loaded context of "
                           f"{limit} (load the model with a larger --ctx)")
    # as llama.cpp: the whole text tokenized with BOS (where the model adds one) in front
    ids = model.tokenizer.encode(text, add_special=True, parse_special=False) \
        if isinstance(text, str) else [int(i) for i in text]
    chunks = len(ids) // n_ctx
    if max_chunks > 0:
        chunks = min(chunks, max_chunks)
    if chunks < 1:
        raise ValueError(f"perplexity: the text has {len(ids)} tokens, fewer than one chunk "
                         f"of {n_ctx} (use a longer text or a smaller context)")
    bos = model.tokenizer.bos_id if model.tokenizer.vocab.add_bos else None
    session = Session(model.transformer, model.backend, n_ctx)
    first = n_ctx // 2
    nll, running = [], []
    for c in range(chunks):
        chunk = ids[c * n_ctx:(c + 1) * n_ctx]
        if bos is not None:
            chunk = [bos] + chunk[1:]
        _, scored = session.prefill_scored(chunk, top=0)   # scored[j]: chunk[j + 1]
        nll.append(-np.array([e.logprob for e in scored[first:]]))
        mean = float(np.concatenate(nll).mean())
        running.append(math.exp(mean))
        if progress is not None:
            progress(c + 1, chunks, running[-1])
    values = np.concatenate(nll)
    mean = float(values.mean())
    ppl = math.exp(mean)
    spread = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return PerplexityResult(ppl, ppl * spread / math.sqrt(len(values)), mean, len(values),
                            chunks, n_ctx, running)
