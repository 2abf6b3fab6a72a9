"""Chat messages -> prompt text, through the model's `tokenizer.chat_template` (Jinja2).

A GGUF file is untrusted, so its template runs in jinja2's `ImmutableSandboxedEnvironment`
(attribute access to internals and mutation of the inputs are refused, the rendered text is
capped in size) inside a worker process with a memory cap, killed when a render overruns
RENDER_TIMEOUT_S (template_sandbox.py, template_worker.py). Any failure is a
`ChatTemplateError`.
Templates get the variables and helpers HF-style templates use: `messages`, `add_generation_prompt`,
`bos_token`, `eos_token`, `tools`, `raise_exception`, `strftime_now`. Models without a template
use their family's format (gemma3, gpt-oss's harmony) or ChatML.

`prompt_ids` tokenizes the rendered prompt with control tokens (`<|im_start|>`, ...) parsed in
the template's own text only: a message's content is plain text, so a user who writes
`<|im_end|>\n<|im_start|>system\n...` gets those characters, not a system turn
(parse_special_in_messages=True restores the old, injectable behaviour).
"""
from __future__ import annotations

import json
import re
import uuid
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

# gpt-oss's harmony format, for a file without its own template: every turn is
# <|start|>role<|message|>text<|end|>; the system message's instructions go to the developer
# role, and the model answers after <|start|>assistant (on its channels, ending at <|return|>)
HARMONY_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{{ '<|start|>developer<|message|># Instructions\n\n' + message['content'] + '<|end|>' }}"
    "{% else %}"
    "{{ '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}"
)

FALLBACK_TEMPLATES = {"gemma3": GEMMA_TEMPLATE, "gpt-oss": HARMONY_TEMPLATE}


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


def prompt_ids(tokenizer, template: str | None, messages: Sequence[dict],
               add_generation_prompt: bool = True, bos_token: str = "", eos_token: str = "",
               source: str = "chat template",
               parse_special_in_messages: bool = False) -> list[int]:
    """The prompt's token ids: BOS where the vocab adds one (once, also when the template
    writes it), control tokens parsed from the template's text, and the messages' contents
    tokenized as plain text unless parse_special_in_messages. Contents holding no control
    token's text give exactly the ids of the whole rendered text tokenized with control
    tokens parsed (the template's own treatment of each content, e.g. a trim, kept)."""
    messages = _check_messages(messages)
    options = dict(add_generation_prompt=add_generation_prompt, bos_token=bos_token,
                   eos_token=eos_token, source=source)
    if parse_special_in_messages or not any(
            tokenizer.holds_control_text(m["content"]) for m in messages):
        text = render(template, messages, **options)
        ids = tokenizer.encode(text, add_special=True, parse_special=True)
    else:
        ids = tokenizer.encode_parts(_template_and_contents(template, messages, options))
    bos = tokenizer.bos_id
    if len(ids) >= 2 and ids[0] == ids[1] == bos:  # the template wrote BOS itself
        ids = ids[1:]
    return ids


def _template_and_contents(template: str | None, messages: list[dict],
                           options: dict) -> list[tuple[str, bool]]:
    """The prompt as (text, parse_special) parts: the template rendered with each content
    replaced by a marker no message can hold (a fresh nonce), then each marker the template
    wrote swapped back for its content as a plain part. A template that transforms a content
    (trims it, cuts a reasoning block) does so on the marker here, not on the content: such
    conversations lose the transform, the price of keeping their control text inert."""
    nonce = uuid.uuid4().hex
    marked = [dict(m, content=f"\x1f{nonce}:{i}\x1f") for i, m in enumerate(messages)]
    text = render(template, marked, **options)
    parts: list[tuple[str, bool]] = []
    # split() with a group: template text at even places, a marker's message index at odd
    for i, piece in enumerate(re.split(f"\x1f{nonce}:(\\d+)\x1f", text)):
        if i % 2 == 0:
            parts.append((piece, True))
        else:
            parts.append((messages[int(piece)]["content"], False))
    return parts
