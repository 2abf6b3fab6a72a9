"""Continuous batching: several generations share one model, their decode steps run together.

Input: a loaded `llm.Model` and a number of slots (sequences in flight at once, each with its
own KV cache of `slot_ctx` positions). Output: `BatchScheduler.generate(ids, ...)`, an iterator
of text pieces that any thread may call. One worker thread owns the model: between decode
steps it admits waiting requests into free slots (their prompts' prefill, reusing what the slot
already caches; the prompts admitted together in one forward pass,
`Transformer.forward_prompts`, as far as one prefill step holds them and where they are enough
to beat their graphs one by one, the running requests' next tokens riding along as one-token
prompts so that they do not pause), then runs one decode step for every active slot at once
(`Transformer.forward_batch`: each weight matrix is read once per step for all of them) and
samples each row with its own request's sampler. A slot decoding alone takes the one-sequence
path (the kernels backend's decode graph). This is what llama.cpp's server does with
`--parallel N` slots; as there, the context is split between the slots.

The running requests always hold slots 0 .. B-1: the slots' caches come from
`Backend.kv_caches` (on the kernels backend one allocation, so a step's attention over the B
first slots is one launch, and one graph serves every batch of B). A request finishing below
the last running slot trades places with the last one (through one spare cache: the finished
history goes to the last slot, the running request's cache into the freed one); a request
whose cached prefix sits in a slot beyond B is copied to slot B. An idle slot keeps what it
holds for a later request with the same prefix (a chat's next turn) until it is reused.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from queue import SimpleQueue
from typing import Iterator, Sequence

import numpy as np

from llm.batch_picks import step_picks
from llm.batch_slots import common_prefix, move_slot, prompt_groups, trade_slots
from llm.generate import (Generation, GenerationStats, Session, check_prompt_fits,
                          prefill_step_tokens, prefill_together)
from llm.sampling import NonFiniteLogitsError, Sampler, SamplingParams, sample_among_rows
from llm.serve_metrics import ServeMetrics

_END = object()      # a request's queue: generation over
# prompt lengths whose graphs warm_up captures, one per tile class of the prompt matmuls
# (stdlib gemm_q8_k.SMALL_KTILES up to 64 tokens, then 128-row tiles; the GEMVs up to 8);
# their kernels, and those of every other length, compiled before by precompile_prompts
WARM_PROMPTS = (8, 16, 32, 48, 64, 128, 256)


@dataclass(eq=False)
class _Request:
    ids: list
    gen: Generation
    pieces: SimpleQueue = field(default_factory=SimpleQueue)   # str, then _END or an error
    slot: int = -1
    token: int = -1              # sampled, not yet run through the model
    decode_start: float = 0.0
    prompt_logprobs: bool = False
    cancelled: bool = False      # the consumer went away: the slot is freed at the next step


class BatchScheduler:
    def __init__(self, model, slots: int = 1, slot_ctx: int | None = None,
                 warm_up: bool = False):
        if not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be a positive int, got {slots!r}")
        slot_ctx = slot_ctx or model.n_ctx // slots
        if slot_ctx < 2:
            raise ValueError(f"{slots} slots leave {slot_ctx} positions of the {model.n_ctx}-"
                             f"token context to each; raise the context (--ctx) or use fewer")
        self.model, self.slot_ctx = model, slot_ctx
        cfg = model.config
        # one spare cache beyond the slots (with two or more): a finished request's history
        # parks there while the last running request moves into its slot (_release, trade_slots)
        caches = model.backend.kv_caches(slots + (slots > 1), cfg.n_layer, slot_ctx,
                                         cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v)
        self._spare = caches[slots] if slots > 1 else None
        self.sessions = [Session(model.transformer, model.backend, slot_ctx, cache=c)
                         for c in caches[:slots]]
        self._busy: list[_Request | None] = [None] * slots
        self._last_used = [0] * slots
        self._clock = 0
        self._waiting: deque[_Request] = deque()
        # (request, text / _END) sampled but not yet handed to its consumer: handed out while
        # the next decode step runs on the device (_flush), not between steps with it idle
        self._handoffs: list[tuple[_Request, object]] = []
        self._wake = threading.Condition()
        self._closed = False
        # what the worker ran and where its time went; gauges read at each snapshot
        self.metrics = ServeMetrics(lambda: {
            "requests_running": sum(r is not None for r in self._busy),
            "requests_waiting": len(self._waiting)})
        if warm_up:
            self.warm_up()
        self._worker = threading.Thread(target=self._work, name="pykernel-batching", daemon=True)
        self._worker.start()

    def warm_up(self) -> None:
        """On a backend with graphs (kernels): compile and capture the batched step of every
        batch size 2 .. slots on the still empty slots, so that the first time B requests run
        together does not stall them all for its kernels' compile (seconds per size on the
        first run of a model; the compile cache makes later starts quick); compile the
        kernels of prompt passes of every length up to one prefill step (precompile_prompts:
        a 40-token prompt's first pass compiled ~5 s under the requests, a 960-token pass of
        prompts admitted together ~9 s); and capture the prompt graphs of WARM_PROMPTS'
        lengths (one per tile class of the prompt matmuls), shared by every slot. Before
        serving."""
        transformer = self.model.transformer
        if not self.model.backend.use_graphs:
            return
        for b in range(2, self.slots + 1):    # every attention split plan of each size
            transformer.warm_batch([s.cache for s in self.sessions[:b]])
        caches = [s.cache for s in self.sessions]
        transformer.precompile_prompts(caches, prefill_step_tokens(transformer,
                                                                 self.model.backend.options))
        first = self.sessions[0]
        for n in WARM_PROMPTS:
            if n < self.slot_ctx:
                for _ in range(2):            # run eagerly (compiles), then captured
                    first.reset()
                    first.prefill_act([0] * n)
        self.model.backend.synchronize()
        for session in self.sessions:
            session.reset()

    @property
    def slots(self) -> int:
        return len(self.sessions)

    def generate(self, ids: Sequence[int], max_tokens: int = 128, stop: Sequence[str] = (),
                 stats: GenerationStats | None = None, logprobs: int | None = None,
                 logprob_sink: list | None = None, prompt_logprobs: bool = False,
                 **sampling) -> Iterator[str]:
        """Text pieces of the continuation of token ids (as Model.generate; sampling keywords
        are SamplingParams fields). Bad options and a prompt longer than a slot's context
        raise here, before anything is queued; errors of the run come out of the iterator.
        logprobs=N: each generated token's TokenLogprobs (with the N likeliest) is appended
        to logprob_sink before the text it completes is yielded; prompt_logprobs: first those
        of the prompt's tokens after the first (its prefill then reads every position's
        logits and reuses no cached prefix)."""
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError("cannot run an empty prompt (no tokens)")
        check_prompt_fits(ids, self.slot_ctx)
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        sampler = Sampler(SamplingParams(**sampling))
        stop = [stop] if isinstance(stop, str) else list(stop)
        if logprobs is not None and not (isinstance(logprobs, int) and 0 <= logprobs <= 20):
            raise ValueError(f"logprobs must be an int in 0..20, got {logprobs!r}")
        gen = Generation(self.model.tokenizer, ids, sampler, max_tokens, stop, stats, logprobs)
        if logprob_sink is not None:
            gen.logprob_entries = logprob_sink
        request = _Request(ids, gen, prompt_logprobs=prompt_logprobs and logprobs is not None)
        with self._wake:
            if self._closed:
                raise RuntimeError("the batch scheduler is closed")
            self._waiting.append(request)
            self._wake.notify()
        return self._pieces(request)

    def close(self) -> None:
        """Stop the worker after its current step; requests still queued or running end with
        an error."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._worker.join()
        self.model.transformer.drop_batch_graphs()   # graphs hold the slots' caches

    @staticmethod
    def _pieces(request: _Request) -> Iterator[str]:
        try:
            while True:
                item = request.pieces.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            request.cancelled = True

    # --- the worker ----------------------------------------------------------------------
    def _work(self) -> None:
        metrics = self.metrics
        while True:
            self._flush()
            with self._wake:
                if not self._closed and not self._waiting and not any(self._busy):
                    with metrics.timed("idle"):
                        while not self._closed and not self._waiting and not any(self._busy):
                            self._wake.wait()
                if self._closed:
                    break
                admitted = self._admit()
            metrics.add("requests_total", len(admitted))
            riders = [r for r in self._busy if r is not None and r not in admitted
                      and not r.cancelled]            # decoding already: they step along
            together = self.model.transformer.min_prompts_together
            for group, tokens in prompt_groups(self.sessions, admitted, self._step_tokens):
                if len(group) < together:         # one by one (the prompts' graphs)
                    for request in group:
                        self._guarded([request], self._start, [request])
                elif tokens + len(riders) > self._step_tokens:
                    self._guarded(group, self._start, group)
                else:
                    self._guarded(group + riders, self._start, group, riders)
                    riders = []
            for request in [r for r in self._busy if r is not None and r.cancelled]:
                self._release(request)
            active = [r for r in self._busy if r is not None]    # slots 0 .. B-1, in order
            if active:
                self._guarded(active, self._step, active)
        self._flush()
        closed = RuntimeError("the batch scheduler was closed")
        for request in [*self._waiting, *(r for r in self._busy if r is not None)]:
            request.pieces.put(closed)

    def _admit(self) -> list[_Request]:
        """Waiting requests moved into free slots (called holding the lock)."""
        admitted = []
        while self._waiting and None in self._busy:
            request = self._waiting.popleft()
            if request.cancelled:
                continue
            request.slot = self._take_slot(request.ids)
            self._busy[request.slot] = request
            admitted.append(request)
        return admitted

    def _take_slot(self, ids: list) -> int:
        """The first free slot (the running requests hold those before it), holding the
        longest cached prefix of ids found in a free slot (a chat's next turn finds its
        history; among equals the least recently used is copied)."""
        def common(slot: int) -> int:
            return common_prefix(self.sessions[slot].tokens, ids)
        target = self._busy.index(None)
        best = max(range(target, self.slots),
                   key=lambda s: (common(s), s == target, -self._last_used[s]))
        if common(best) > common(target):
            with self.metrics.timed("slots"):
                move_slot(self.sessions, best, target)
        return target

    def _guarded(self, requests: list, run, *args) -> None:
        """run(*args); an error ends `requests` with it (their slots emptied), never the
        worker."""
        try:
            run(*args)
        except Exception as exc:      # noqa: BLE001 (handed to the requests' consumers)
            self._flush()                 # the requests' texts before their error
            for request in requests:
                if self._busy[request.slot] is request:
                    self.sessions[request.slot].reset()
                    self.metrics.add("requests_failed_total")
                    request.pieces.put(exc)
                    self._release(request)

    @property
    def _step_tokens(self) -> int:
        return prefill_step_tokens(self.model.transformer, self.model.backend.options)

    def _start(self, group: list, riders: Sequence = ()) -> None:
        """Run the group's prompts (one forward pass for two or more, or with riders) and
        sample each one's first token. riders: running requests whose pending token steps in
        the same pass (a one-token prompt each, over their own slot), so that they go on
        while new requests start instead of pausing for them."""
        t0 = time.perf_counter()
        with self.metrics.timed("prompt"):
            if len(group) > 1 or riders:
                sessions = [self.sessions[r.slot] for r in (*group, *riders)]
                prompts = [r.ids for r in group] + [
                    [*self.sessions[r.slot].tokens, r.token] for r in riders]
                rows, computed = prefill_together(sessions, prompts)
            else:
                request, session = group[0], self.sessions[group[0].slot]
                if request.prompt_logprobs:
                    row, scored = session.prefill_scored(request.ids, request.gen.logprobs)
                    request.gen.logprob_entries.extend(scored)
                    rows, computed = [row], [len(request.ids)]
                else:
                    row, n = session.prefill(request.ids)
                    rows, computed = [row], [n]
        seconds = time.perf_counter() - t0
        self.metrics.add("prompt_passes_total")
        for request, n in zip(group, computed):
            request.gen.stats.prompt_tokens, request.gen.stats.prompt_seconds = n, seconds
            request.decode_start = time.perf_counter()
            self.metrics.add("prompt_tokens_total", n)
        self.metrics.add("prompt_pass_decode_rows_total", len(riders))
        with self.metrics.timed("sample"):
            for request in riders:
                request.gen.stats.decode_steps += 1
            done = [r for r, row in zip((*group, *riders), rows) if self._advance_one(r, row)]
        for request in done:          # after every one is sampled (a release moves slots)
            self._release(request)

    def _step(self, active: list) -> None:
        sessions = [self.sessions[r.slot] for r in active]
        with self.metrics.timed("decode", batch=len(active)):
            if len(active) == 1:
                logits = sessions[0].step_act(active[0].token)
            else:
                ids = np.array([r.token for r in active], np.int64)
                positions = np.array([len(s.tokens) for s in sessions], np.int64)
                logits = self.model.transformer.forward_batch(ids, positions,
                                                              [s.cache for s in sessions])
                for session, request in zip(sessions, active):
                    session.tokens.append(request.token)
            self._flush()        # the last step's text, while this one runs on the device
            picks, rows = step_picks(self.model.backend, [r.gen for r in active], logits)
        with self.metrics.timed("sample"):
            listed = [i for i, pick in enumerate(picks) if isinstance(pick, tuple)]
            if listed:                           # candidate lists: all of them in one pass
                drawn = sample_among_rows([active[i].gen.sampler for i in listed],
                                          [picks[i] for i in listed])
                for i, token in zip(listed, drawn):
                    picks[i] = token
            done = []
            for request, row, pick in zip(active, rows, picks):
                request.gen.stats.decode_steps += 1
                if self._advance_one(request, row, pick):
                    done.append(request)
        for request in done:          # in the order they finished
            self._release(request)

    def _advance_one(self, request: _Request, logits: np.ndarray | None,
                     token: int | None = None) -> bool:
        """_advance, where an error (a sampler refusing non-finite logits, a stop string's
        decode...) ends this request alone: its consumer gets the error after the text it
        already has, its slot's cache is dropped, and the step's other requests go on. True
        when the request is done either way (the caller releases its slot)."""
        try:
            return self._advance(request, logits, token)
        except Exception as exc:      # noqa: BLE001 (handed to the request's consumer)
            self.sessions[request.slot].reset()    # its history is not worth keeping
            self._handoffs.append((request, exc))
            self.metrics.add("requests_failed_total")
            return True

    def _advance(self, request: _Request, logits: np.ndarray | None,
                 token: int | None = None) -> bool:
        """Take the request's next token (given, or sampled from its logits row) and pass on
        the final text; True when the request is done (its consumer has everything; the
        caller releases its slot)."""
        gen, session = request.gen, self.sessions[request.slot]
        if isinstance(token, NonFiniteLogitsError):    # its row of a step's device picks
            raise token
        if token is None:
            token = gen.sampler.sample(logits, gen.history)
        self.metrics.add("tokens_generated_total")
        gen.note_logprobs(logits, token)
        text = gen.accept(token, context_full=len(session.tokens) >= session.n_ctx)
        if text:
            self._handoffs.append((request, text))
        if not gen.done:
            request.token = token
            return False
        gen.stats.decode_seconds = time.perf_counter() - request.decode_start
        tail = gen.finish()
        if tail:
            self._handoffs.append((request, tail))
        self._handoffs.append((request, _END))
        return True

    def _flush(self) -> None:
        """Hand the sampled texts to their consumers. Each put may wake a consumer thread
        that then takes the GIL from the worker (~20 us a request on a 2-core machine): done
        while a decode step runs on the device, that costs the step nothing."""
        handoffs, self._handoffs = self._handoffs, []
        for request, item in handoffs:
            request.pieces.put(item)

    def _release(self, request: _Request) -> None:
        """Free the request's slot; the last running request moves into it, so that the
        running ones stay in slots 0 .. B-1."""
        slot = request.slot
        self.metrics.add("requests_finished_total")
        self._clock += 1
        self._last_used[slot] = self._clock
        self._busy[slot] = None
        last = max((s for s, r in enumerate(self._busy) if r is not None), default=-1)
        if last > slot:
            moved = self._busy[last]
            try:
                with self.metrics.timed("slots"):
                    trade_slots(self.sessions, self._spare, slot, last)
            except Exception as exc:     # noqa: BLE001 (the moved request ends with it)
                self._busy[last] = None
                self.sessions[slot].reset()
                self.sessions[last].reset()
                self._flush()
                moved.pieces.put(exc)
                return
            self._busy[slot], self._busy[last] = moved, None
            self._last_used[last] = self._clock     # the finished history's recency
            moved.slot = slot

