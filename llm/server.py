"""`pykernel serve`: the loaded model behind an OpenAI-compatible HTTP API (the subset that
llama.cpp's llama-server and Ollama's /v1 endpoints offer for one model).

Input: a loaded `llm.Model`, host and port. Output: a `ThreadingHTTPServer` answering
    GET  /health                  {"status": "ok"}
    GET  /v1/models               the one model
    GET  /metrics                 the scheduler's counters, Prometheus text format
                                  (llm/serve_metrics.py)
    POST /v1/completions          {"prompt": str | ids | [str | ids, ...], "n", "echo", ...}
                                  -> text_completion, a choice per prompt and n
    POST /v1/chat/completions     {"messages": [...], ...} -> chat.completion
    POST /tokenize, /detokenize   llama.cpp server's token endpoints
with "stream": true answered as server-sent events (`data: {chunk}` ... `data: [DONE]`).
Sampling fields: max_tokens, temperature, top_p, top_k, min_p, seed, stop (str or list),
presence_penalty, frequency_penalty, repeat_penalty, repeat_last_n; log-probabilities of the
generated tokens: `logprobs: N` (completions), `logprobs: true` + `top_logprobs: N` (chat).

Requests run through a `BatchScheduler` (llm/batching.py): up to `parallel` sequences at once,
each in its own slot of the KV cache, their decode steps batched; a request finding every
slot busy waits for one. A chat's next turn goes to the slot caching its history and reuses
that prefix. Request bodies are untrusted: size, JSON (nesting, finite numbers), field types
and ranges are checked and refused with HTTP 4xx and an OpenAI-style error object naming the
field; a request whose generation fails gets HTTP 500 alone; a client that stalls is dropped
after `ServerLimits.io_timeout_s`, one that misbehaves costs one line on stderr (never a
traceback); nothing in a request can stop the server. The wire (limits, body, answers):
llm/server_wire.py.
"""
from __future__ import annotations

import sys
import time
import uuid
from http.server import ThreadingHTTPServer

from llm.batching import BatchScheduler
from llm.chat import ChatTemplateError
from llm.generate import ContextError, GenerationStats, TokenLogprobs
from llm.serve_metrics import prometheus_text
from llm.server_api import (FINISH, LogprobFormatter, RequestError, chat_messages,
                            choice_count, completion_prompts, flag, generation_options,
                            logprob_count, token_ids)
from llm.server_wire import JsonHandler, ServerLimits, one_line


class GenerationFailed(Exception):
    """A request's generation raised (e.g. non-finite logits): that request gets HTTP 500,
    the others go on."""


def _failures_as_500(pieces):
    """The text pieces of one run; an error of the run comes out as GenerationFailed (a
    ValueError raised while generating is the server's failure, not a bad request)."""
    try:
        yield from pieces
    except Exception as exc:       # noqa: BLE001 (whatever failed, this request alone ends)
        raise GenerationFailed(f"generation failed: {type(exc).__name__}: "
                               f"{one_line(exc)}") from exc


class ModelServer(ThreadingHTTPServer):
    daemon_threads = True
    # the listen backlog: socketserver's default of 5 made a burst of 16 clients lose
    # connection attempts, which the clients' TCP retried ~1 s later (benchmarks/RESULTS.md
    # "Prompts on any slot": requests joining the batch late)
    request_queue_size = 1024

    def __init__(self, model, address: tuple, model_name: str, default_max_tokens: int = 256,
                 parallel: int = 1, warm_up: bool = False,
                 limits: ServerLimits = ServerLimits(), parse_special_in_messages: bool = False):
        self.limits = limits
        # False: a chat message's <|im_start|> is text, not a control token (llm.chat)
        self.parse_special_in_messages = parse_special_in_messages
        # its errors (and its warm-up) before the port is bound
        self.scheduler = BatchScheduler(model, parallel, warm_up=warm_up)
        try:
            super().__init__(address, Handler)
        except BaseException:        # e.g. the port is taken: no worker thread left behind
            self.scheduler.close()
            raise
        self.model, self.model_name = model, model_name
        self.default_max_tokens = default_max_tokens

    def server_close(self) -> None:
        super().server_close()
        self.scheduler.close()

    def handle_error(self, request, client_address) -> None:
        """A connection that ended with an error the handler did not answer (a client that
        hung up mid-request or mid-answer): one line, where socketserver prints a traceback
        (two, chained, when the final flush fails too)."""
        exc = sys.exc_info()[1]
        host, port = client_address[:2]
        print(f"client {host}:{port}: connection ended: {type(exc).__name__}: "
              f"{one_line(exc)}", file=sys.stderr)


def make_server(model, host: str = "127.0.0.1", port: int = 8080,
                model_name: str | None = None, parallel: int = 1,
                warm_up: bool = False, limits: ServerLimits = ServerLimits(),
                parse_special_in_messages: bool = False) -> ModelServer:
    """A server for `model` bound to (host, port) (port 0: any free port; see .server_port)
    running up to `parallel` requests at once (the model's context split between them; warm_up:
    BatchScheduler.warm_up first; limits: body size and I/O timeout; parse_special_in_messages:
    control tokens read from chat messages' contents too, as before issue 45); call
    .serve_forever() (or run it in a thread), then .shutdown() and .server_close()."""
    name = model_name or str(getattr(model, "path", "model")).rsplit("/", 1)[-1]
    return ModelServer(model, (host, port), name, parallel=parallel, warm_up=warm_up,
                       limits=limits, parse_special_in_messages=parse_special_in_messages)


class Handler(JsonHandler):
    server: ModelServer

    # --- routing ---------------------------------------------------------------------------
    def do_GET(self):                          # noqa: N802 (http.server's naming)
        if self.path == "/health":
            self.send_json(200, {"status": "ok"})
        elif self.path == "/metrics":
            self.send_text(200, prometheus_text(self.server.scheduler.metrics.snapshot()),
                           "text/plain; version=0.0.4")
        elif self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [
                {"id": self.server.model_name, "object": "model", "owned_by": "pykernel"}]})
        else:
            self._error(404, f"no route GET {self.path}", "not_found_error")

    def do_POST(self):                         # noqa: N802
        routes = {"/v1/completions": self._completion, "/v1/chat/completions": self._chat,
                  "/tokenize": self._tokenize, "/detokenize": self._detokenize}
        route = routes.get(self.path)
        if route is None:
            self._error(404, f"no route POST {self.path}", "not_found_error")
            return
        try:
            route(self.read_json_body())
        except (RequestError, ContextError, ChatTemplateError) as exc:
            self.log_client(f"{self.command} {self.path}: refused: {exc}")
            self._error(getattr(exc, "status", 400), str(exc))
        except (ConnectionError, TimeoutError) as exc:    # the client left or stalled
            self.log_client(f"{self.command} {self.path}: {type(exc).__name__}: {exc}")
            self.close_connection = True
        except GenerationFailed as exc:
            self.log_client(f"{self.command} {self.path}: {exc}")
            self._error(500, str(exc), "server_error")
        except ValueError as exc:              # e.g. an option Model.generate refuses
            self.log_client(f"{self.command} {self.path}: refused: {exc}")
            self._error(400, str(exc))
        except Exception as exc:               # noqa: BLE001 (the server stays)
            self.log_client(f"{self.command} {self.path}: {type(exc).__name__}: {exc}")
            self._error(500, f"{type(exc).__name__}: {exc}", "server_error")

    # --- endpoints -------------------------------------------------------------------------
    def _completion(self, body: dict) -> None:
        options = generation_options(body, self.server.default_max_tokens)
        options["logprobs"] = logprob_count(body, chat=False)
        model = self.server.model
        prompts = completion_prompts(body, model.tokenizer, model.config.n_vocab)
        n = choice_count(body, len(prompts))
        streaming = flag(body, "stream")
        if streaming and len(prompts) * n > 1:
            raise RequestError("a streamed completion has one choice (send several prompts or "
                               "n > 1 without \"stream\", or one request each)")
        self._generate(prompts, options, streaming, chat=False, echo=flag(body, "echo"), n=n)

    def _chat(self, body: dict) -> None:
        messages = chat_messages(body)
        options = generation_options(body, self.server.default_max_tokens)
        options["logprobs"] = logprob_count(body, chat=True)
        ids = self.server.model.chat_ids(messages, self.server.parse_special_in_messages)
        n, streaming = choice_count(body, 1), flag(body, "stream")
        if streaming and n > 1:
            raise RequestError("a streamed chat completion has one choice (n = 1)")
        self._generate([(ids, None)], options, streaming, chat=True, n=n)

    def _tokenize(self, body: dict) -> None:
        """llama.cpp server's POST /tokenize: {"content", "add_special" (default false),
        "with_pieces"} -> {"tokens": [id...]} or [{"id", "piece"}...]."""
        content = body.get("content")
        if not isinstance(content, str):
            raise RequestError("'content' must be a string")
        tokenizer = self.server.model.tokenizer
        ids = tokenizer.encode(content, add_special=flag(body, "add_special"),
                               parse_special=False)
        if flag(body, "with_pieces"):
            pieces = [tokenizer.token_to_piece(t).decode("utf-8", errors="replace")
                      for t in ids]
            self.send_json(200, {"tokens": [{"id": t, "piece": p} for t, p in zip(ids, pieces)]})
        else:
            self.send_json(200, {"tokens": ids})

    def _detokenize(self, body: dict) -> None:
        """llama.cpp server's POST /detokenize: {"tokens": [id...]} -> {"content"}."""
        tokens, model = body.get("tokens"), self.server.model
        ids = [] if tokens == [] else token_ids(tokens, model.config.n_vocab, "tokens")
        self.send_json(200, {"content": model.tokenizer.decode(ids)})

    def _generate(self, prompts: list, options: dict, streaming: bool, chat: bool,
                  echo: bool = False, n: int = 1) -> None:
        """Answer (token ids, text or None) prompts, n choices each (choice i * n + j: prompt
        i's j-th, sampled with seed + j when a seed is given), all queued at once (so they
        decode together); echo: each choice's text (and logprobs) begins with its prompt's."""
        tokenizer, scheduler = self.server.model.tokenizer, self.server.scheduler
        prompt_tokens = sum(len(ids) for ids, _ in prompts)      # counted once per prompt
        prompts = [p for p in prompts for _ in range(n)]
        seeds = [None if options.get("seed") is None else options["seed"] + i % n
                 for i in range(len(prompts))]
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        stats = [GenerationStats() for _ in prompts]
        wants_logprobs = options["logprobs"] is not None
        # an echoed prompt's first token has no log-probability: the entry leads its sink
        sinks = [([TokenLogprobs(ids[0], None, None)] if echo else []) if wants_logprobs
                 else None for ids, _ in prompts]
        formatters = [LogprobFormatter(tokenizer, chat) for _ in prompts]
        echoed = [(text if text is not None else tokenizer.decode(ids)) if echo else ""
                  for ids, text in prompts]

        def envelope(choices: list, usage: dict | None = None, chunk: bool = False) -> dict:
            out = {"id": ident, "object": kind + (".chunk" if chunk and chat else ""),
                   "created": created, "model": self.server.model_name, "choices": choices}
            if usage is not None:
                out["usage"] = usage
            return out

        def usage() -> dict:
            completion = sum(s.generated_tokens for s in stats)
            return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                    "total_tokens": prompt_tokens + completion}

        def with_logprobs(choice: dict) -> dict:
            """choice plus the logprobs of the tokens generated since its last choice."""
            i = choice["index"]
            choice["logprobs"] = None if sinks[i] is None else formatters[i].take(sinks[i])
            return choice

        runs = []
        try:
            for (ids, _), st, sink, seed in zip(prompts, stats, sinks, seeds):
                runs.append(scheduler.generate(ids, stats=st, logprob_sink=sink,
                                               prompt_logprobs=echo, **dict(options, seed=seed)))
            texts = [_failures_as_500(run) for run in runs]
            if streaming:
                self._stream_events(texts[0], envelope, usage, stats[0], chat, with_logprobs,
                                    echoed[0])
            else:
                choices = []
                for i, pieces in enumerate(texts):
                    text = echoed[i] + "".join(pieces)
                    finish = FINISH.get(stats[i].stop_reason, "stop")
                    choices.append(with_logprobs(
                        {"index": i, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish} if chat else
                        {"index": i, "text": text, "finish_reason": finish}))
                self._log_all(prompts, stats)   # before the reply: a client that stops the
                self.send_json(200, envelope(choices, usage()))     # server next still sees it
                return
        finally:
            for run in runs:
                run.close()          # a client gone mid-stream frees its slot
        self._log_all(prompts, stats)

    def _log_all(self, prompts, stats) -> None:
        for (ids, _), st in zip(prompts, stats):
            self._log(ids, st)

    def _stream_events(self, pieces, envelope, usage, stats: GenerationStats, chat: bool,
                       with_logprobs, echoed: str = "") -> None:
        first = next(pieces, None)         # errors of the run before any header
        self.start_events()
        if chat:
            self.send_event(envelope([{"index": 0, "delta": {"role": "assistant"},
                                   "finish_reason": None}], chunk=True))
        if echoed:
            self.send_event(envelope([with_logprobs({"index": 0, "text": echoed,
                                                 "finish_reason": None})], chunk=True))
        piece = first
        while piece is not None:
            choice = ({"index": 0, "delta": {"content": piece}, "finish_reason": None} if chat
                      else {"index": 0, "text": piece, "finish_reason": None})
            self.send_event(envelope([with_logprobs(choice)], chunk=True))
            piece = next(pieces, None)
        finish = FINISH.get(stats.stop_reason, "stop")
        last = ({"index": 0, "delta": {}, "finish_reason": finish} if chat else
                {"index": 0, "text": "", "finish_reason": finish})
        self.send_event(envelope([with_logprobs(last)], usage(), chunk=True))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def _log(self, ids: list, stats: GenerationStats) -> None:
        print(f"{self.command} {self.path}: prompt {len(ids)} tokens ({stats.prompt_tokens} "
              f"run), {stats.generated_tokens} generated ({stats.decode_tps:.1f} tok/s), "
              f"stop: {stats.stop_reason}", file=sys.stderr)

    def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        self.send_error_json(status, message, kind)
