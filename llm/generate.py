"""Token generation: prompt ids -> streamed text pieces, with a KV cache kept across calls.

`Session` owns one preallocated KV cache and the ids it holds; a new prompt that starts with the
cached ids only runs the new suffix (chat turns reuse the history). `stream` prefills, samples
until max_tokens, an end-of-generation token, a stop string or a full context, and yields valid
UTF-8 text; text that could be the start of a stop string is held back until it is decided.
`GenerationStats` records token counts, timings and why generation stopped.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from llm import step as S
from llm.sampling import Sampler, check_finite_logits



def prefill_step_tokens(transformer, options) -> int:
    """Tokens per step of a prompt's prefill: the transformer's own (the kernels backend's
    largest prompt graph, options.prefill_graph_max) or the backend's options.prefill_chunk."""
    return transformer.prefill_step_tokens or options.prefill_chunk


class ContextError(ValueError):
    """The prompt (plus at least one generated token) does not fit the context."""


@dataclass
class GenerationStats:
    prompt_tokens: int = 0        # ids run through the model for the prompt (after reuse)
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    decode_steps: int = 0         # forward passes after the prompt (the first token needs none)
    decode_seconds: float = 0.0
    stop_reason: str = ""         # "max_tokens", "eog", "stop_string", "context"

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def decode_tps(self) -> float:
        return self.decode_steps / self.decode_seconds if self.decode_seconds else 0.0


class Session:
    """One sequence in one KV cache of `n_ctx` positions."""

    def __init__(self, transformer, backend, n_ctx: int, cache=None):
        cfg = transformer.cfg
        self.transformer, self.backend, self.n_ctx = transformer, backend, n_ctx
        self.cache = cache or backend.kv_cache(cfg.n_layer, n_ctx, cfg.n_head_kv, cfg.head_dim,
                                               cfg.head_dim_v)
        self.tokens: list[int] = []

    def reset(self) -> None:
        self.tokens = []

    def prefill(self, ids: Sequence[int]) -> tuple[np.ndarray, int]:
        """Make the cache hold exactly `ids`; returns (last position's logits, ids computed)."""
        logits, computed = self.prefill_act(ids)
        return self.backend.to_host(logits)[-1], computed

    def prefill_scored(self, ids: Sequence[int], top: int) -> tuple[np.ndarray, list]:
        """prefill from an empty cache with every position's logits read: (the last
        position's logits, the TokenLogprobs of ids[1:], each under the logits before it, with
        its `top` likeliest). For a prompt's own log-probabilities (the API's echo)."""
        ids = [int(i) for i in ids]
        if not ids or len(ids) > self.n_ctx:
            raise ContextError(f"the prompt has {len(ids)} tokens; the context holds "
                               f"{self.n_ctx} (and at least one is needed)")
        self.tokens, entries, row = [], [], None
        # every row's logits come back: step x vocab floats
        options = self.backend.options
        step = min(options.prefill_chunk, prefill_step_tokens(self.transformer, options))
        for start in range(0, len(ids), step):
            chunk = ids[start:start + step]
            logits = self.backend.to_host(self.transformer.forward(
                S.tokens(chunk, start, all_logits=True), [self.cache]))
            entries += [token_logprobs(logits[j], ids[start + j + 1], top)
                        for j in range(len(chunk)) if start + j + 1 < len(ids)]
            row = logits[-1]
            self.tokens.extend(chunk)
        return row, entries

    def step(self, token: int) -> np.ndarray:
        """Append one token; returns the logits after it."""
        return self.backend.to_host(self.step_act(token))[-1]

    def prefill_act(self, ids: Sequence[int]):
        """prefill, with the logits left as a backend activation (1, n_vocab)."""
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError("cannot run an empty prompt (no tokens)")
        reuse = self.reusable(ids)
        self.tokens = self.tokens[:reuse]
        logits = None
        step = prefill_step_tokens(self.transformer, self.backend.options)
        for start in range(reuse, len(ids), step):
            chunk = np.asarray(ids[start:start + step], dtype=np.int64)
            logits = self.transformer.forward(S.tokens(chunk, start), [self.cache])
            self.tokens.extend(int(i) for i in chunk)
        return logits, len(ids) - reuse

    def reusable(self, ids: Sequence[int]) -> int:
        """How many of ids' first tokens the cache holds already (never the last one, which
        runs again for its logits); ContextError where ids do not fit the context."""
        if len(ids) > self.n_ctx:
            raise ContextError(f"the prompt has {len(ids)} tokens but the context holds "
                               f"{self.n_ctx}; shorten the prompt or raise the context (--ctx)")
        reuse = 0
        for a, b in zip(self.tokens, ids[:-1]):
            if a != b:
                break
            reuse += 1
        return reuse

    def step_act(self, token: int):
        """step, with the logits left as a backend activation (1, n_vocab)."""
        if len(self.tokens) >= self.n_ctx:
            raise ContextError(f"the context of {self.n_ctx} tokens is full")
        logits = self.transformer.forward(S.tokens([token], len(self.tokens)), [self.cache])
        self.tokens.append(int(token))
        return logits


def prefill_together(sessions: Sequence[Session], prompts: Sequence[Sequence[int]]):
    """Session.prefill of several sessions in one forward pass (Transformer.forward_prompts:
    the weights read once for all their new tokens, which should fit one prefill step
    together). Returns (each prompt's last logits, (len(prompts), n_vocab) on the host; the
    ids computed for each)."""
    prompts = [[int(i) for i in ids] for ids in prompts]
    if not all(prompts):
        raise ValueError("cannot run an empty prompt (no tokens)")
    starts = [session.reusable(ids) for session, ids in zip(sessions, prompts)]
    for session, start in zip(sessions, starts):
        session.tokens = session.tokens[:start]
    first = sessions[0]
    logits = first.transformer.forward_prompts([ids[s:] for ids, s in zip(prompts, starts)],
                                               starts, [s.cache for s in sessions])
    for session, ids, start in zip(sessions, prompts, starts):
        session.tokens.extend(ids[start:])
    return first.backend.to_host(logits), [len(ids) - s for ids, s in zip(prompts, starts)]


class _StopMatcher:
    """Holds back text that may begin a stop string; reports where a stop string starts."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, stopped)."""
        self.pending += text
        hits = [self.pending.find(s) for s in self.stops]
        hits = [h for h in hits if h >= 0]
        if hits:
            out, self.pending = self.pending[:min(hits)], ""
            return out, True
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.pending)), hold, -1):
                if self.pending.endswith(s[:n]):
                    hold = n
                    break
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


@dataclass
class TokenLogprobs:
    token: int
    logprob: float
    top: list          # [(token, logprob)], likeliest first


def token_logprobs(logits: np.ndarray, token: int, top: int) -> TokenLogprobs:
    """token's log-probability under the model (the softmax of the raw logits, before
    penalties and temperature: what the model says, as OpenAI's API reports it) and the `top`
    likeliest tokens'."""
    x = np.asarray(logits, np.float64)
    peak = x.max()
    log_total = peak + np.log(np.exp(x - peak).sum())
    best = []
    if top:
        best = np.argpartition(-x, top - 1)[:top] if top < len(x) else np.arange(len(x))
        best = best[np.argsort(-x[best], kind="stable")]
    return TokenLogprobs(int(token), float(x[token] - log_total),
                         [(int(i), float(x[i] - log_total)) for i in best])


class Generation:
    """One request's decoding after its prompt: takes each sampled token and decides what text
    is final and whether generation ends (end-of-generation token, stop string, max_tokens,
    full context). `stream` drives one on a Session; the batch scheduler drives many."""

    def __init__(self, tokenizer, prompt_ids: Sequence[int], sampler: Sampler, max_tokens: int,
                 stop: Sequence[str] = (), stats: GenerationStats | None = None,
                 logprobs: int | None = None):
        self.tokenizer, self.sampler, self.max_tokens = tokenizer, sampler, max_tokens
        # logprobs = N: each generated token's log-probability and the N likeliest (note_logprobs)
        self.logprobs = logprobs
        self.logprob_entries: list[TokenLogprobs] = []
        self.stats = stats if stats is not None else GenerationStats()
        self.stats.stop_reason = "max_tokens"
        self.history = list(prompt_ids)     # the penalties' window reads the prompt too
        self._decoder, self._matcher = tokenizer.stream_decoder(), _StopMatcher(stop)
        self.done = max_tokens <= 0

    def note_logprobs(self, logits: np.ndarray, token: int) -> None:
        """Record token's TokenLogprobs (token_logprobs) unless token ends the generation."""
        if self.logprobs is not None and not self.tokenizer.is_eog(token):
            self.logprob_entries.append(token_logprobs(logits, token, self.logprobs))

    def accept(self, token: int, context_full: bool) -> str:
        """Text made final by `token`; sets `done` when generation ends with it (context_full:
        the sequence has no room to run this token, so it is the last)."""
        stats = self.stats
        if self.tokenizer.is_eog(token):
            stats.stop_reason, self.done = "eog", True
            return ""
        self.history.append(token)
        stats.generated_tokens += 1
        text, stopped = self._matcher.push(self._decoder.add(token))
        if stopped:
            stats.stop_reason = "stop_string"
        elif stats.generated_tokens >= self.max_tokens:
            pass                                   # stop_reason stays "max_tokens"
        elif context_full:
            stats.stop_reason = "context"
        else:
            return text
        self.done = True
        return text

    def finish(self) -> str:
        """The text held back (an undecided stop-string prefix, an incomplete character), once
        generation has ended for any reason but a stop string."""
        if self.stats.stop_reason == "stop_string":
            return ""
        tail, _ = self._matcher.push(self._decoder.flush())
        return tail + self._matcher.flush()


def check_prompt_fits(prompt_ids: Sequence[int], n_ctx: int) -> None:
    if len(prompt_ids) >= n_ctx:
        raise ContextError(f"the prompt has {len(prompt_ids)} tokens but the context holds "
                           f"{n_ctx} (one more is needed to generate); shorten the "
                           f"prompt or raise the context (--ctx)")


def _device_steps(session: Session, sampler: Sampler, token: int, limit: int):
    """The tokens after `token` picked on the device, step by step ahead of the host (a
    graphed backend's greedy_tokens or sampled_tokens; at most `limit` and what the context
    holds), or None where the host picks them: no graphs, penalties, a seeded sampler (its
    draws are the host's, so that a seed gives the same tokens on every backend)."""
    transformer, start = session.transformer, len(session.tokens)
    if not session.backend.use_graphs:
        return None
    n = min(session.n_ctx - start, limit)
    if sampler.plain_argmax:
        return transformer.greedy_tokens(token, start, session.cache, n)
    if sampler.device_draws:
        return transformer.sampled_tokens(token, start, session.cache, n, sampler.params,
                                          sampler.rng.random(max(n, 0)))
    return None


def _stream_on_device(session: Session, gen: Generation, tokens: Iterator[int], token: int,
                      text: str) -> Iterator[str]:
    """stream's loop when the tokens come from _device_steps: the same texts, stats and
    session.tokens as stepping token by token."""
    try:
        for following in tokens:          # the step that ran `token` made `following`
            session.tokens.append(token)
            gen.stats.decode_steps += 1
            if text:
                yield text
            token, text = following, gen.accept(
                following, context_full=len(session.tokens) >= session.n_ctx)
            if gen.done:
                break
        if text:
            yield text
    finally:
        tokens.close()


def _check_host_greedy(session: Session, logits, sampler: Sampler) -> None:
    """NonFiniteLogitsError where a plain greedy pick on the host would take a NaN row's
    argmax for a token (broken weights or hyperparameters); every other host path checks the
    rows it reads (Sampler.sample, sample_among). Rows that stay on a device are not read
    here: that would copy the very rows device sampling exists to keep there."""
    backend = session.backend
    if sampler.plain_argmax and not backend.logits_on_device:
        check_finite_logits(backend.to_host(backend.last_row(logits)))


def stream(session: Session, tokenizer, prompt_ids: Sequence[int], sampler: Sampler,
           max_tokens: int, stop: Sequence[str] = (), stats: GenerationStats | None = None,
           ) -> Iterator[str]:
    """Generate after `prompt_ids`, yielding text pieces as soon as they are final."""
    gen = Generation(tokenizer, prompt_ids, sampler, max_tokens, stop, stats)
    stats = gen.stats
    check_prompt_fits(prompt_ids, session.n_ctx)
    t0 = time.perf_counter()
    logits, stats.prompt_tokens = session.prefill_act(prompt_ids)
    session.backend.synchronize()    # the prompt's time is its device work's, not its launches'
    stats.prompt_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    _check_host_greedy(session, logits, sampler)
    token = session.backend.sample(logits, sampler, gen.history)
    text = gen.accept(token, context_full=len(session.tokens) >= session.n_ctx)
    steps = None if gen.done else _device_steps(session, sampler, token, max_tokens)
    if steps is not None:
        # each step's pick feeds the next step on the device, one step queued ahead of the
        # token the host reads (the GPU never waits)
        yield from _stream_on_device(session, gen, steps, token, text)
    else:
        while True:
            if not gen.done:
                # the next step is queued before the text goes out: on a GPU it runs while
                # the consumer prints or sends the text (the next sample waits for it)
                logits = session.step_act(token)
                stats.decode_steps += 1
            if text:
                yield text
            if gen.done:
                break
            _check_host_greedy(session, logits, sampler)
            token = session.backend.sample(logits, sampler, gen.history)
            text = gen.accept(token, context_full=len(session.tokens) >= session.n_ctx)
    stats.decode_seconds = time.perf_counter() - t0
    tail = gen.finish()
    if tail:
        yield tail
