"""The HTTP wire under `pykernel serve`'s endpoints (llm/server.py): the server's limits, the
request body read as JSON, and the JSON, text and event-stream answers.

Input: a client connection (untrusted: it may send too much, nest its JSON too deeply, stop
in the middle of its headers or body, or hang up at any point). Output: the parsed body (a
dict) or a `RequestError` naming what is wrong; answers written back; one line on stderr per
client that misbehaved (never a traceback), and no thread held by an idle connection for
longer than `ServerLimits.io_timeout_s`.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

from llm.server_api import RequestError


@dataclass(frozen=True)
class ServerLimits:
    """Every bound the server puts on a client, in one place (make_server(limits=...))."""
    max_body_bytes: int = 4 << 20
    # each read of the request line, a header line or the body, and each write of an answer,
    # waits at most this long: a client that stops sending (slowloris) or reading, or an
    # idle keep-alive connection, frees its thread after it
    io_timeout_s: float = 30.0


def one_line(text: str, limit: int = 300) -> str:
    """A message for one log line or one JSON error: the first line, bounded."""
    lines = str(text).strip().splitlines()
    first = lines[0] if lines else ""
    return first if len(first) <= limit else first[:limit] + "..."


def _refuse_constant(name: str):
    raise RequestError(f"request body holds {name}, which is not JSON (numbers must be "
                       "finite)")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):      # e.g. 1e400: every field wants finite
        raise RequestError(f"request body holds the number {text[:40]}, too large for a "
                           "64-bit float")
    return value


class JsonHandler(BaseHTTPRequestHandler):
    """http.server's handler with the wire helpers the endpoints use; `server.limits` is a
    ServerLimits."""
    protocol_version = "HTTP/1.1"
    _answered = False      # a status line sent: a later error can only end the connection
    _streaming = False     # event-stream headers sent: a later error goes out as an event

    def setup(self) -> None:
        # StreamRequestHandler.setup applies self.timeout to the connection's socket
        self.timeout = self.server.limits.io_timeout_s
        super().setup()

    def log_message(self, format, *args):      # noqa: A002 (the base class's name)
        pass                                   # quiet: the server prints one line per request

    def log_error(self, format, *args):        # noqa: A002
        """http.server's own complaints (a malformed request line, a timed-out read): one
        line naming the client."""
        self.log_client(format % args)

    def log_client(self, message: str) -> None:
        host, port = self.client_address[:2]
        print(f"client {host}:{port}: {one_line(message)}", file=sys.stderr)

    def read_json_body(self) -> dict:
        """The request's body as a JSON object. Refusals raised before the body is read close
        the connection (its unread bytes would otherwise be taken for the next request)."""
        limit = self.server.limits.max_body_bytes
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.close_connection = True
            raise RequestError("a Content-Length header is required", status=411) from None
        if not 0 <= length <= limit:
            self.close_connection = True
            raise RequestError(f"request body of {length} bytes (at most {limit})", status=413)
        raw = self.rfile.read(length)       # TimeoutError after io_timeout_s of silence
        try:
            body = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
        except RecursionError:
            # the C parser recurses once per level of [ or {: a deep body runs out of stack
            raise RequestError(f"request body nests deeper than the JSON parser's limit "
                               f"(~{sys.getrecursionlimit()} levels)") from None
        except (ValueError, UnicodeDecodeError) as exc:
            if isinstance(exc, RequestError):
                raise
            raise RequestError(f"request body is not JSON: {one_line(exc)}") from None
        if not isinstance(body, dict):
            raise RequestError("request body must be a JSON object")
        return body

    # --- answers ---------------------------------------------------------------------------
    def send_json(self, status: int, payload: dict) -> None:
        self.send_text(status, json.dumps(payload), "application/json")

    def send_text(self, status: int, text: str, content_type: str) -> None:
        data = text.encode()
        self._answered = True
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def send_error_json(self, status: int, message: str,
                        kind: str = "invalid_request_error") -> None:
        """An OpenAI-style error object; after an event stream began, an error event and the
        end of the connection instead (no second status line can follow the first)."""
        error = {"error": {"message": one_line(message, 2000), "type": kind}}
        if self._streaming:
            self.send_event(error)
            self.close_connection = True
        elif not self._answered:
            self.send_json(status, error)

    def start_events(self) -> None:
        self._answered = self._streaming = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()

    def send_event(self, payload: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
        self.wfile.flush()
