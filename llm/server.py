"""`pykernel serve`: the loaded model behind an OpenAI-compatible HTTP API (the subset that
llama.cpp's llama-server and Ollama's /v1 endpoints offer for one model).

Input: a loaded `llm.Model`, host and port. Output: a `ThreadingHTTPServer` answering
    GET  /health                  {"status": "ok"}
    GET  /v1/models               the one model
    POST /v1/completions          {"prompt": str, ...} -> text_completion
    POST /v1/chat/completions     {"messages": [...], ...} -> chat.completion
with "stream": true answered as server-sent events (`data: {chunk}` ... `data: [DONE]`).
Sampling fields: max_tokens, temperature, top_p, top_k, min_p, seed, stop (str or list),
presence_penalty, frequency_penalty, repeat_penalty, repeat_last_n; log-probabilities of the
generated tokens: `logprobs: N` (completions), `logprobs: true` + `top_logprobs: N` (chat).

Requests run through a `BatchScheduler` (llm/batching.py): up to `parallel` sequences at once,
each in its own slot of the KV cache, their decode steps batched; a request finding every
slot busy waits for one. A chat's next turn goes to the slot caching its history and reuses
that prefix. Request bodies are untrusted: size,
JSON, field types and values are checked and refused with HTTP 400 and an OpenAI-style error
object; nothing in a request can stop the server.
"""
from __future__ import annotations

import json
import sys
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from llm.batching import BatchScheduler
from llm.chat import ChatTemplateError
from llm.generate import ContextError, GenerationStats

MAX_BODY_BYTES = 4 << 20
# request field -> (Model.generate keyword, accepted types)
SAMPLING_FIELDS = {
    "max_tokens": ("max_tokens", int), "temperature": ("temperature", (int, float)),
    "top_p": ("top_p", (int, float)), "top_k": ("top_k", int), "min_p": ("min_p", (int, float)),
    "seed": ("seed", int), "presence_penalty": ("presence_penalty", (int, float)),
    "frequency_penalty": ("frequency_penalty", (int, float)),
    "repeat_penalty": ("repeat_penalty", (int, float)), "repeat_last_n": ("repeat_last_n", int),
}
FINISH = {"max_tokens": "length", "context": "length", "eog": "stop", "stop_string": "stop"}


class RequestError(ValueError):
    """A request the server refuses (HTTP 400), with the message the client sees."""


def generation_options(body: dict, default_max_tokens: int) -> dict:
    """Model.generate keywords from a request body (RequestError on a bad field)."""
    options = {"max_tokens": default_max_tokens}
    for field, (keyword, types) in SAMPLING_FIELDS.items():
        if field not in body or body[field] is None:
            continue
        value = body[field]
        if isinstance(value, bool) or not isinstance(value, types):
            raise RequestError(f"'{field}' must be a number, got {json.dumps(value)[:40]}")
        options[keyword] = value
    if options["max_tokens"] < 1:
        raise RequestError("'max_tokens' must be at least 1")
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise RequestError("'stop' must be a string or a list of strings")
        options["stop"] = [s for s in stops if s]
    if body.get("n", 1) != 1:
        raise RequestError("only n = 1 is supported")
    return options


def logprob_count(body: dict, chat: bool) -> int | None:
    """How many likeliest alternatives per generated token a request asks for with its
    log-probabilities (None: no logprobs). Completions: `"logprobs": N`; chat: `"logprobs":
    true` and `"top_logprobs": N` (OpenAI's two spellings)."""
    if chat:
        wanted = body.get("logprobs")
        if wanted is None or wanted is False:
            if body.get("top_logprobs") is not None:
                raise RequestError("'top_logprobs' needs \"logprobs\": true")
            return None
        if wanted is not True:
            raise RequestError("'logprobs' must be true or false")
        count = body.get("top_logprobs")
        count, field = (0 if count is None else count), "top_logprobs"
    else:
        count, field = body.get("logprobs"), "logprobs"
        if count is None:
            return None
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 20:
        raise RequestError(f"'{field}' must be an integer in 0..20")
    return count


class LogprobFormatter:
    """The API's logprobs objects for the TokenLogprobs entries a generation appended to its
    sink since the last call (one per chunk when streaming, all at once otherwise)."""

    def __init__(self, tokenizer, chat: bool):
        self.tokenizer, self.chat = tokenizer, chat
        self.taken, self.offset = 0, 0

    def take(self, sink: list) -> dict:
        entries, self.taken = sink[self.taken:], len(sink)
        if self.chat:
            return {"content": [dict(self._token(e.token, e.logprob), top_logprobs=[
                self._token(t, lp) for t, lp in e.top]) for e in entries]}
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e in entries:
            text = self._text(e.token)
            out["tokens"].append(text)
            out["token_logprobs"].append(e.logprob)
            out["top_logprobs"].append({self._text(t): lp for t, lp in e.top})
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out

    def _text(self, token: int) -> str:
        return self.tokenizer.token_to_piece(token).decode("utf-8", errors="replace")

    def _token(self, token: int, logprob: float) -> dict:
        piece = self.tokenizer.token_to_piece(token)
        return {"token": piece.decode("utf-8", errors="replace"), "logprob": logprob,
                "bytes": list(piece)}


def _messages(body: dict) -> list:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list")
    for m in messages:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)):
            raise RequestError("each message needs a string 'role' and a string 'content'")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


class ModelServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, model, address: tuple, model_name: str, default_max_tokens: int = 256,
                 parallel: int = 1, warm_up: bool = False):
        # its errors (and its warm-up) before the port is bound
        self.scheduler = BatchScheduler(model, parallel, warm_up=warm_up)
        super().__init__(address, Handler)
        self.model, self.model_name = model, model_name
        self.default_max_tokens = default_max_tokens

    def server_close(self) -> None:
        super().server_close()
        self.scheduler.close()


def make_server(model, host: str = "127.0.0.1", port: int = 8080,
                model_name: str | None = None, parallel: int = 1,
                warm_up: bool = False) -> ModelServer:
    """A server for `model` bound to (host, port) (port 0: any free port; see .server_port)
    running up to `parallel` requests at once (the model's context split between them; warm_up:
    BatchScheduler.warm_up first); call .serve_forever() (or run it in a thread), then
    .shutdown() and .server_close()."""
    name = model_name or str(getattr(model, "path", "model")).rsplit("/", 1)[-1]
    return ModelServer(model, (host, port), name, parallel=parallel, warm_up=warm_up)


class Handler(BaseHTTPRequestHandler):
    server: ModelServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):      # noqa: A002 (the base class's name)
        pass                                   # quiet: the CLI prints one line per request

    # --- routing ---------------------------------------------------------------------------
    def do_GET(self):                          # noqa: N802 (http.server's naming)
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [
                {"id": self.server.model_name, "object": "model", "owned_by": "pykernel"}]})
        else:
            self._error(404, f"no route GET {self.path}", "not_found_error")

    def do_POST(self):                         # noqa: N802
        routes = {"/v1/completions": self._completion, "/v1/chat/completions": self._chat}
        route = routes.get(self.path)
        if route is None:
            self._error(404, f"no route POST {self.path}", "not_found_error")
            return
        try:
            body = self._body()
            route(body)
        except RequestError as exc:
            self._error(400, str(exc))
        except (ContextError, ChatTemplateError) as exc:
            self._error(400, str(exc))
        except (BrokenPipeError, ConnectionResetError):
            pass                               # the client went away mid-stream
        except ValueError as exc:              # e.g. temperature < 0, checked by SamplingParams
            if not self._answered:
                self._error(400, str(exc))
        except Exception as exc:               # noqa: BLE001 (a failed run: the server stays)
            if not self._answered:
                self._error(500, f"{type(exc).__name__}: {exc}", "server_error")

    # --- endpoints -------------------------------------------------------------------------
    def _completion(self, body: dict) -> None:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise RequestError("'prompt' must be a string")
        options = generation_options(body, self.server.default_max_tokens)
        options["logprobs"] = logprob_count(body, chat=False)
        model = self.server.model
        ids = model.tokenizer.encode(prompt, add_special=True, parse_special=False)
        self._generate(ids, options, bool(body.get("stream")), chat=False)

    def _chat(self, body: dict) -> None:
        messages = _messages(body)
        options = generation_options(body, self.server.default_max_tokens)
        options["logprobs"] = logprob_count(body, chat=True)
        ids = self.server.model.chat_ids(messages)
        self._generate(ids, options, bool(body.get("stream")), chat=True)

    def _generate(self, ids: list, options: dict, streaming: bool, chat: bool) -> None:
        stats = GenerationStats()
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"

        def envelope(choice: dict, usage: dict | None = None, chunk: bool = False) -> dict:
            out = {"id": ident, "object": kind + (".chunk" if chunk and chat else ""),
                   "created": created, "model": self.server.model_name, "choices": [choice]}
            if usage is not None:
                out["usage"] = usage
            return out

        def usage() -> dict:
            return {"prompt_tokens": len(ids), "completion_tokens": stats.generated_tokens,
                    "total_tokens": len(ids) + stats.generated_tokens}

        sink = [] if options["logprobs"] is not None else None
        formatter = LogprobFormatter(self.server.model.tokenizer, chat)

        def with_logprobs(choice: dict) -> dict:
            """choice plus the logprobs of the tokens generated since the last choice."""
            choice["logprobs"] = None if sink is None else formatter.take(sink)
            return choice

        pieces = self.server.scheduler.generate(ids, stats=stats, logprob_sink=sink, **options)
        try:
            if streaming:
                self._stream_events(pieces, envelope, usage, stats, chat, with_logprobs)
            else:
                text = "".join(pieces)
                finish = FINISH.get(stats.stop_reason, "stop")
                choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                           "finish_reason": finish} if chat else
                          {"index": 0, "text": text, "finish_reason": finish})
                self._json(200, envelope(with_logprobs(choice), usage()))
        finally:
            pieces.close()           # a client gone mid-stream frees its slot
        self._log(ids, stats)

    def _stream_events(self, pieces, envelope, usage, stats: GenerationStats, chat: bool,
                       with_logprobs) -> None:
        first = next(pieces, None)         # errors of the run before any header
        self._start_events()
        if chat:
            self._event(envelope({"index": 0, "delta": {"role": "assistant"},
                                  "finish_reason": None}, chunk=True))
        piece = first
        while piece is not None:
            choice = ({"index": 0, "delta": {"content": piece}, "finish_reason": None} if chat
                      else {"index": 0, "text": piece, "finish_reason": None})
            self._event(envelope(with_logprobs(choice), chunk=True))
            piece = next(pieces, None)
        finish = FINISH.get(stats.stop_reason, "stop")
        last = ({"index": 0, "delta": {}, "finish_reason": finish} if chat else
                {"index": 0, "text": "", "finish_reason": finish})
        self._event(envelope(with_logprobs(last), usage(), chunk=True))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def _log(self, ids: list, stats: GenerationStats) -> None:
        print(f"{self.command} {self.path}: prompt {len(ids)} tokens ({stats.prompt_tokens} "
              f"run), {stats.generated_tokens} generated ({stats.decode_tps:.1f} tok/s), "
              f"stop: {stats.stop_reason}", file=sys.stderr)

    # --- wire ------------------------------------------------------------------------------
    def _body(self) -> dict:
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise RequestError("a Content-Length header is required") from None
        if not 0 <= length <= MAX_BODY_BYTES:
            raise RequestError(f"request body of {length} bytes (at most {MAX_BODY_BYTES})")
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RequestError(f"request body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise RequestError("request body must be a JSON object")
        return body

    _answered = False      # a status line sent: a later error can only end the connection

    def _json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self._answered = True
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        self._json(status, {"error": {"message": message, "type": kind}})

    def _start_events(self) -> None:
        self._answered = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()

    def _event(self, payload: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
        self.wfile.flush()
