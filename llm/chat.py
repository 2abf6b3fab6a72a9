"""Chat messages -> prompt text, through the model's `tokenizer.chat_template` (Jinja2).

A GGUF file is untrusted, so its template runs in jinja2's `ImmutableSandboxedEnvironment`:
attribute access to internals (`__class__`, `__subclasses__`, ...) and mutation of the inputs
are refused, and the rendered text is capped in size. Any failure is a `ChatTemplateError`.
Templates get the variables and helpers HF-style templates use: `messages`, `add_generation_prompt`,
`bos_token`, `eos_token`, `tools`, `raise_exception`, `strftime_now`. Models without a template
use ChatML.
"""
from __future__ import annotations

import datetime
import json
from typing import Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_RENDERED_CHARS = 4_000_000  # a template that produces more is treated as hostile

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# Gemma has no system role: a system message is folded into the first user turn
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.system = message['content'] + '\n\n' %}"
    "{% else %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role'])"
    " + '\n' + ns.system + message['content'] + '<end_of_turn>\n' }}"
    "{% set ns.system = '' %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

FALLBACK_TEMPLATES = {"gemma3": GEMMA_TEMPLATE}


def fallback_template(arch: str) -> str:
    """The template for a model whose file has none: its family's format, else ChatML."""
    return FALLBACK_TEMPLATES.get(arch, CHATML_TEMPLATE)


class ChatTemplateError(ValueError):
    """The chat template could not be rendered (bad syntax, unsafe code, or raise_exception)."""


class _TemplateRaised(Exception):
    pass


def _raise_exception(message: str):
    raise _TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


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


def _tojson(value, indent=None, ensure_ascii=False, **_ignored):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


def _check_messages(messages: Sequence[dict]) -> list[dict]:
    checked = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) \
                or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} must be a dict with string 'role' and 'content', "
                             f"got {m!r}")
        checked.append(dict(m))
    return checked


def render(template: str | None, messages: Sequence[dict], add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "", source: str = "chat template") -> str:
    """The prompt text for `messages`; `template` None uses ChatML."""
    messages = _check_messages(messages)
    try:
        compiled = _environment().from_string(template or CHATML_TEMPLATE)
        pieces, size = [], 0
        variables = dict(messages=messages, add_generation_prompt=add_generation_prompt,
                         bos_token=bos_token, eos_token=eos_token, tools=None)
        for piece in compiled.generate(**variables):
            size += len(piece)
            if size > MAX_RENDERED_CHARS:
                raise ChatTemplateError(f"{source}: output exceeds {MAX_RENDERED_CHARS} characters")
            pieces.append(piece)
        return "".join(pieces)
    except ChatTemplateError:
        raise
    except _TemplateRaised as exc:
        raise ChatTemplateError(f"{source} rejected the messages: {exc}") from None
    except jinja2.exceptions.SecurityError as exc:
        raise ChatTemplateError(f"{source} tried an unsafe operation and was stopped: "
                                f"{exc}") from None
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"{source} could not be rendered: {exc}") from None
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ZeroDivisionError,
            OverflowError, RecursionError) as exc:
        raise ChatTemplateError(f"{source} failed: {type(exc).__name__}: {exc}") from None
