"""Chat messages -> prompt text, through the model's `tokenizer.chat_template` (Jinja2).

A GGUF file is untrusted, so its template runs in jinja2's `ImmutableSandboxedEnvironment`
(attribute access to internals and mutation of the inputs are refused, the rendered text is
capped in size) inside a worker process with a memory cap, killed when a render overruns
RENDER_TIMEOUT_S (template_sandbox.py, template_worker.py). Any failure is a
`ChatTemplateError`.
Templates get the variables and helpers HF-style templates use: `messages`, `add_generation_prompt`,
`bos_token`, `eos_token`, `tools`, `raise_exception`, `strftime_now`. Models without a template
use ChatML.
"""
from __future__ import annotations

import json
from typing import Sequence

from llm import template_worker

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
    """The chat template could not be rendered (bad syntax, unsafe code, raise_exception, or
    over its time or memory bound)."""


def _check_messages(messages: Sequence[dict]) -> list[dict]:
    checked = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) \
                or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} must be a dict with string 'role' and 'content', "
                             f"got {m!r}")
        try:   # the worker process gets the messages as JSON
            json.dumps(m)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"message {i} must hold JSON data (str, number, bool, None, "
                             f"list, dict): {exc}") from None
        checked.append(dict(m))
    return checked


def render(template: str | None, messages: Sequence[dict], add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "", source: str = "chat template") -> str:
    """The prompt text for `messages`; `template` None uses ChatML."""
    variables = dict(messages=_check_messages(messages),
                     add_generation_prompt=add_generation_prompt, bos_token=bos_token,
                     eos_token=eos_token, tools=None)
    try:
        return template_worker.render(template or CHATML_TEMPLATE, variables, source)
    except template_worker.RenderFailed as exc:
        raise ChatTemplateError(str(exc)) from None
