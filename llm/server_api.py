"""The OpenAI request fields `pykernel serve` reads and the response pieces it writes: checked
sampling options, prompts (text, token ids, or a list of either), the logprobs options, and the
logprobs objects. Request bodies are untrusted: every check raises `RequestError` (HTTP 400)
with the message the client sees.
"""
from __future__ import annotations

import json

# request field -> (Model.generate keyword, integer only, lowest, highest): the ranges of
# OpenAI's API reference where it gives one (penalties, top_p), else what SamplingParams and
# numpy accept (a seed is a uint64; top_k <= 0 and repeat_last_n -1 mean off / the whole
# history, as in llama.cpp)
SAMPLING_FIELDS = {
    "max_tokens": ("max_tokens", True, 1, 2**31 - 1),
    "temperature": ("temperature", False, 0.0, 1e6),
    "top_p": ("top_p", False, 1e-9, 1.0),
    "top_k": ("top_k", True, -1, 2**31 - 1),
    "min_p": ("min_p", False, 0.0, 1.0),
    "seed": ("seed", True, 0, 2**64 - 1),
    "presence_penalty": ("presence_penalty", False, -2.0, 2.0),
    "frequency_penalty": ("frequency_penalty", False, -2.0, 2.0),
    "repeat_penalty": ("repeat_penalty", False, 1e-9, 1e6),
    "repeat_last_n": ("repeat_last_n", True, -1, 2**31 - 1),
}
# the roles OpenAI's chat API defines; a chat template sees no other
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
FINISH = {"max_tokens": "length", "context": "length", "eog": "stop", "stop_string": "stop"}


MAX_PROMPTS = 16      # prompts of one completions request (one choice each)


class RequestError(ValueError):
    """A request the server refuses (HTTP 400 unless `status` says otherwise: 411, 413),
    with the message the client sees."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _number(body: dict, field: str, integer: bool, low, high):
    """body[field] checked to be a number (an integer if asked) in [low, high]."""
    value = body[field]
    wanted = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise RequestError(f"'{field}' must be {wanted}, got {json.dumps(value)[:40]}")
    if value < low:
        raise RequestError(f"'{field}' must be at least {low}, got {value}")
    if value > high:
        raise RequestError(f"'{field}' must be at most {high}, got {value}")
    return value


def generation_options(body: dict, default_max_tokens: int) -> dict:
    """Model.generate keywords from a request body (RequestError on a bad field)."""
    options = {"max_tokens": default_max_tokens}
    for field, (keyword, integer, low, high) in SAMPLING_FIELDS.items():
        if body.get(field) is not None:
            options[keyword] = _number(body, field, integer, low, high)
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise RequestError("'stop' must be a string or a list of strings")
        options["stop"] = [s for s in stops if s]
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("'model' must be a string")
    return options


def choice_count(body: dict, prompts: int) -> int:
    """`n`: choices per prompt (1..MAX_PROMPTS, at most MAX_PROMPTS choices in all)."""
    n = body.get("n", 1)
    n = 1 if n is None else n
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise RequestError("'n' must be a positive integer")
    if n * prompts > MAX_PROMPTS:
        raise RequestError(f"{n} choices for each of {prompts} prompt(s): at most "
                           f"{MAX_PROMPTS} choices a request")
    return n


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
    sink since the last call (one per chunk when streaming, all at once otherwise). An echoed
    prompt's first token has no log-probability: an entry with logprob and top None."""

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
            out["top_logprobs"].append(None if e.top is None else
                                       {self._text(t): lp for t, lp in e.top})
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out

    def _text(self, token: int) -> str:
        return self.tokenizer.token_to_piece(token).decode("utf-8", errors="replace")

    def _token(self, token: int, logprob: float) -> dict:
        piece = self.tokenizer.token_to_piece(token)
        return {"token": piece.decode("utf-8", errors="replace"), "logprob": logprob,
                "bytes": list(piece)}


def _is_ids(value) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


def token_ids(value, n_vocab: int, field: str) -> list:
    """A non-empty list of token ids of the vocabulary, checked."""
    if not _is_ids(value):
        raise RequestError(f"'{field}' must be a non-empty list of token ids")
    bad = [t for t in value if not 0 <= t < n_vocab]
    if bad:
        raise RequestError(f"token id {bad[0]} is outside the vocabulary [0, {n_vocab})")
    return list(value)


def completion_prompts(body: dict, tokenizer, n_vocab: int) -> list[tuple[list, str | None]]:
    """(token ids, text or None) per prompt of a completions request: `prompt` as a string
    (tokenized with BOS where the model adds one), as a list of token ids (used as given: a
    client that tokenizes itself, as lm-evaluation-harness does), or a list of up to
    MAX_PROMPTS of either, each answered by its own choice."""
    def one(prompt) -> tuple[list, str | None]:
        if isinstance(prompt, str):
            return tokenizer.encode(prompt, add_special=True, parse_special=False), prompt
        if _is_ids(prompt):
            return token_ids(prompt, n_vocab, "prompt"), None
        raise RequestError("'prompt' must be a string, a list of token ids, or a list of those")
    prompt = body.get("prompt")
    if isinstance(prompt, str) or _is_ids(prompt):
        return [one(prompt)]
    if isinstance(prompt, list) and 0 < len(prompt) <= MAX_PROMPTS:
        return [one(p) for p in prompt]
    raise RequestError(f"'prompt' must be a string, a list of token ids, or a list of 1 to "
                       f"{MAX_PROMPTS} of those")


def flag(body: dict, field: str) -> bool:
    value = body.get(field, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"'{field}' must be true or false")
    return value


def chat_messages(body: dict) -> list:
    """The messages of a chat request as {"role", "content"} dicts of strings: a known role,
    and content as a string or OpenAI's list of text parts (joined)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list")
    checked = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise RequestError(f"'messages[{i}]' must be an object with a string 'role' and "
                               "a string 'content'")
        if m.get("role") not in CHAT_ROLES:
            raise RequestError(f"'messages[{i}].role' must be one of {', '.join(CHAT_ROLES)}, "
                               f"got {json.dumps(m.get('role'))[:40]}")
        checked.append({"role": m["role"], "content": _content(m.get("content"), i)})
    return checked


def _content(content, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content):
        return "".join(p["text"] for p in content)
    raise RequestError(f"'messages[{i}].content' must be a string (each message needs a "
                       "string 'content') or a list of {\"type\": \"text\", \"text\"} parts")
