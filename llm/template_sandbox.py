"""Chat template + variables -> prompt text, inside jinja2's sandbox, in a worker process.

A GGUF file is untrusted and its `tokenizer.chat_template` is a program. jinja2's
`ImmutableSandboxedEnvironment` refuses internals (`__class__`, `__globals__`, ...) and
mutation of the inputs, but nothing in it bounds time or memory: nested `range` loops run for
hours and `[0] * 10**9` takes 8 GB. So templates render in a child process (this file run as a
script; it imports nothing of `llm`, only jinja2 and the standard library) that caps its own
address space, and the parent (`llm.chat`) kills it when a render overruns its deadline.

Protocol: `{"ready": true}` once started; then for each JSON line on stdin,
`{"template", "variables", "source"}`, one JSON line on stdout, `{"text": ...}` or
`{"error": message}`. The child exits when stdin closes.
"""
from __future__ import annotations

import datetime
import json
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_RENDERED_CHARS = 4_000_000       # a template that produces more is treated as hostile
ADDRESS_SPACE_LIMIT = 1 << 30        # the worker's whole virtual memory (Python + jinja2 ~60 MB)


class TemplateRejected(Exception):
    """The template cannot be rendered; the message is the user's error text."""


class _TemplateRaised(Exception):
    pass


def _raise_exception(message: str):
    raise _TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(value, indent=None, ensure_ascii=False, **_ignored):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """Unsafe attribute access raises instead of quietly rendering as empty, so a probing
    template is reported rather than half-rendered."""

    def unsafe_undefined(self, obj, attribute):
        raise jinja2.exceptions.SecurityError(
            f"access to attribute {attribute!r} of a {type(obj).__name__} object is unsafe")


def _environment() -> ImmutableSandboxedEnvironment:
    env = _StrictSandbox(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.Undefined)
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    env.filters["tojson"] = _tojson
    return env


def render_here(template: str, variables: dict, source: str) -> str:
    """Render in this process (the sandbox alone: no time or memory bound). Raises
    TemplateRejected with the message for the user."""
    try:
        compiled = _environment().from_string(template)
        pieces, size = [], 0
        for piece in compiled.generate(**variables):
            size += len(piece)
            if size > MAX_RENDERED_CHARS:
                raise TemplateRejected(f"{source}: output exceeds {MAX_RENDERED_CHARS} characters")
            pieces.append(piece)
        return "".join(pieces)
    except TemplateRejected:
        raise
    except _TemplateRaised as exc:
        raise TemplateRejected(f"{source} rejected the messages: {exc}") from None
    except jinja2.exceptions.SecurityError as exc:
        raise TemplateRejected(f"{source} tried an unsafe operation and was stopped: "
                               f"{exc}") from None
    except jinja2.exceptions.TemplateError as exc:
        raise TemplateRejected(f"{source} could not be rendered: {exc}") from None
    except MemoryError:
        raise TemplateRejected(f"{source} needed more than {ADDRESS_SPACE_LIMIT >> 20} MiB "
                               "and was stopped") from None
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ZeroDivisionError,
            OverflowError, RecursionError) as exc:
        raise TemplateRejected(f"{source} failed: {type(exc).__name__}: {exc}") from None


def _limit_memory():
    try:
        import resource
    except ImportError:       # not POSIX: the deadline still applies
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = ADDRESS_SPACE_LIMIT if hard == resource.RLIM_INFINITY else \
        min(ADDRESS_SPACE_LIMIT, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def serve(stdin=sys.stdin, stdout=sys.stdout):
    """The worker's loop: a request per line in, a reply per line out, until stdin closes."""
    stdout.write(json.dumps({"ready": True}) + "\n")
    stdout.flush()
    for line in stdin:
        request = json.loads(line)
        try:
            reply = {"text": render_here(request["template"], request["variables"],
                                         request["source"])}
        except TemplateRejected as exc:
            reply = {"error": str(exc)}
        stdout.write(json.dumps(reply) + "\n")
        stdout.flush()


if __name__ == "__main__":
    _limit_memory()
    sys.setrecursionlimit(2000)
    serve()
