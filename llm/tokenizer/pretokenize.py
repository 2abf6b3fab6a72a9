"""BPE pre-tokenization: text -> words, as llama.cpp splits them for each `tokenizer.ggml.pre`.

Input: a text fragment (special tokens already split out) and a pre-tokenizer name.
Output: the list of words (str) that BPE merges within, and the GPT-2 byte<->unicode tables
that turn a word's UTF-8 bytes into the printable characters the vocab is written in.

llama.cpp applies a pre-tokenizer's regexes in order; each one splits every piece left by the
previous one into its matches and the text between them (nothing is dropped). Each regex sees
one piece alone, so `$` and look-arounds stop at the piece's ends.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import regex

# GPT-2 style: contractions, optional space + letters / digits / other, whitespace runs.
_GPT2 = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
_LLAMA3_HEAD = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3_TAIL = r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_LLAMA3 = _LLAMA3_HEAD + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|" + _LLAMA3_TAIL
_QWEN2 = _LLAMA3_HEAD + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|" + _LLAMA3_TAIL
_QWEN35 = (_LLAMA3_HEAD + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# DeepSeek LLM lists its Latin/Greek/Cyrillic/... letter ranges explicitly (llama.cpp's table),
# written as escapes because several are compatibility characters that editors normalize away.
_DEEPSEEK_LETTERS = (
    r"A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    r"\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1"
    r"\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5"
    r"\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a"
    r"\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d"
    r"\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3"
    r"\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115"
    r"\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    r"\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    r"\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
    r"\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
    r"\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    r"\U000118a0-\U000118df\U0001e900-\U0001e943"
)
_DEEPSEEK_PUNCT = r"!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002"
_CJK = r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
# gpt-4o (o200k): a word is optional non-letter + upper/title-case run + lower-case run (or
# the reverse) + an optional case-insensitive contraction; digits in threes; '/' trails symbols.
_GPT4O_UPPER, _GPT4O_LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_GPT4O_TAIL = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_GPT4O_UPPER}*{_GPT4O_LOWER}+{_GPT4O_TAIL}"
          rf"|[^\r\n\p{{L}}\p{{N}}]?{_GPT4O_UPPER}+{_GPT4O_LOWER}*{_GPT4O_TAIL}"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_BLOOM = r" ?[^(\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"

# Regex lists per llama.cpp pre-tokenizer type (the type's name is the dict key).
REGEXES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt2": (_GPT2,),
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "qwen35": (_QWEN35,),
    "gpt-4o": (_GPT4O,),
    "smollm": (r"\p{N}", _GPT2),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"),
    "deepseek-llm": (r"[\r\n]", rf"\s?[{_DEEPSEEK_LETTERS}]+",
                     rf"\s?[{_DEEPSEEK_PUNCT}]+", r"\s+\Z", _CJK, r"\p{N}+"),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    "bloom": (_BLOOM,),
    "viking": (_BLOOM, r"\p{N}"),
}


@dataclass(frozen=True)
class PreTokenizer:
    """How one `tokenizer.ggml.pre` value behaves in llama.cpp."""
    regex_set: str              # key of REGEXES
    ignore_merges: bool = False  # a word already in the vocab is one token, unmerged
    add_bos: bool = False        # default for tokenizer.ggml.add_bos_token
    no_bos: bool = False         # llama.cpp drops the BOS id for this tokenizer


_P = PreTokenizer
# `tokenizer.ggml.pre` names -> behaviour (llama.cpp's llama_vocab::load table, BPE part).
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": _P("default"),
    **{name: _P("llama3", ignore_merges=True, add_bos=True) for name in (
        "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
        "lfm2")},
    **{name: _P("llama3") for name in ("dbrx", "smaug-bpe")},
    "chatglm-bpe": _P("llama3", no_bos=True),
    "deepseek-llm": _P("deepseek-llm"),
    "deepseek-coder": _P("deepseek-coder"),
    "falcon": _P("falcon"),
    **{name: _P("gpt2") for name in (
        "gpt-2", "phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de", "jina-v2-es",
        "jina-v2-de", "gigachat", "mellum", "trillion", "granite-docling")},
    **{name: _P("smollm") for name in (
        "starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b")},
    **{name: _P("qwen2") for name in ("qwen2", "deepseek-r1-qwen", "stablelm2")},
    "qwen35": _P("qwen35"),
    **{name: _P("gpt-4o") for name in ("gpt-4o", "llama4")},
    **{name: _P("bloom") for name in ("bloom", "poro-chat", "gpt3-finnish")},
    "viking": _P("viking"),
}


def supported_pre_tokenizers() -> list[str]:
    return sorted(PRE_TOKENIZERS)


# Single regexes equal to a staged list, for speed (tests check them against the stages).
# smollm: digits are split off one by one before the GPT-2 regex sees the rest, so there a
# run of spaces ends before a digit as at the end of the text: (?!\S) becomes (?![^\s\p{N}]).
FUSED: dict[str, tuple[str, ...]] = {
    "smollm": (r"\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])"
               r"|\s+",),
}


class Splitter:
    """Applies one pre-tokenizer's regex list to text fragments."""

    def __init__(self, regex_set: str, fused: bool = True):
        exprs = FUSED.get(regex_set, REGEXES[regex_set]) if fused else REGEXES[regex_set]
        self.stages = [_Stage(expr) for expr in exprs]

    def split(self, text: str) -> list[str]:
        pieces = [text]
        for stage in self.stages:
            if len(pieces) == 1:
                pieces = stage.split(pieces[0])
            else:
                pieces = [part for piece in pieces for part in stage.split(piece)]
        return pieces


class _Stage:
    r"""One regex. Wrapped in a capturing group, split() returns the matches together with the
    text between them, in C (none of our regexes captures anything itself)."""

    def __init__(self, expr: str):
        self.pattern = regex.compile(f"({expr})")
        self.shadowed = _names_non_ascii(expr)
        ascii_expr = _ascii_form(expr)
        # ASCII text: the stdlib engine with \p{L} = [A-Za-z] and \p{N} = [0-9] finds the same
        # matches about twice as fast (\s is the same six characters in both engines).
        self.ascii = re.compile(f"({ascii_expr})", re.ASCII) if ascii_expr else None

    def split(self, piece: str) -> list[str]:
        if piece.isascii():
            pattern = self.ascii or self.pattern
        elif self.shadowed:
            return _split_shadowed(self.pattern, piece)
        else:
            pattern = self.pattern
        return list(filter(None, pattern.split(piece)))


def _names_non_ascii(expr: str) -> bool:
    return not expr.isascii() or "\\u" in expr or "\\U" in expr or "\\x" in expr


_ASCII_CLASSES = {r"\p{L}": "A-Za-z", r"\p{N}": "0-9"}


def _ascii_form(expr: str) -> str | None:
    """expr with \\p{L} and \\p{N} as ASCII ranges, or None if it uses another \\p{..}."""
    if _names_non_ascii(expr):
        return None
    out, inside, i = [], False, 0
    while i < len(expr):
        if expr[i] == "\\":
            token = expr[i:i + 5]
            if token in _ASCII_CLASSES:
                out.append(_ASCII_CLASSES[token] if inside else f"[{_ASCII_CLASSES[token]}]")
                i += 5
                continue
            if expr[i + 1:i + 2] in ("p", "P"):
                return None
            out.append(expr[i:i + 2])
            i += 2
            continue
        inside = (inside or expr[i] == "[") and not (inside and expr[i] == "]")
        out.append(expr[i])
        i += 1
    return "".join(out)


def _split_shadowed(pattern: regex.Pattern, piece: str) -> list[str]:
    """Split as llama.cpp does for a regex naming non-ASCII characters itself: it matches
    against a copy of the text where every non-ASCII whitespace reads as U+000B (so DeepSeek's
    CJK range U+0800-U+4E00 does not take U+3000). Same length, so the offsets cut the piece."""
    shadow = piece.translate(_NON_ASCII_SPACE_TO_VT)
    out = []
    pos = 0
    for match in pattern.finditer(shadow):
        start, end = match.span()
        if start == end:
            continue
        if start > pos:
            out.append(piece[pos:start])
        out.append(piece[start:end])
        pos = end
    if pos < len(piece):
        out.append(piece[pos:])
    return out


_NON_ASCII_SPACE_TO_VT = {c: 0x0B for c in range(0x80, 0x3001) if regex.match(r"\s", chr(c))}


def _gpt2_byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte value (index = byte)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(0x100 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


BYTE_TO_CHAR: list[str] = _gpt2_byte_chars()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
# str.translate table: a latin-1 decoded byte string -> its GPT-2 characters, in one C call.
_LATIN1_TO_GPT2 = {b: c for b, c in enumerate(BYTE_TO_CHAR)}


def byte_encode(word: str) -> str:
    """UTF-8 bytes of word written as GPT-2 byte-level characters."""
    return word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_LATIN1_TO_GPT2)
