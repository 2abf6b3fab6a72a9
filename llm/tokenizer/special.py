"""Special-token partition: text -> fragments of plain text (str) and special token ids (int).

Input: the raw text and whether control tokens may be parsed from it.
Output: the fragments in order, as llama.cpp's tokenizer_st_partition produces them.

Rules (llama.cpp's): the candidates are the tokens with the CONTROL, USER_DEFINED or UNKNOWN
attribute, longest text first; each candidate in turn splits every plain fragment left by the
previous ones at all its non-overlapping occurrences, left to right. Without parse_special only
USER_DEFINED tokens are split out (Hugging Face does the same for "added tokens"). A token with
the LSTRIP/RSTRIP attribute swallows the ASCII whitespace to its left/right.
"""
from __future__ import annotations

from dataclasses import dataclass

from .vocab import TokenAttr, Vocab

_SPECIAL = int(TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN)
_NOT_PLAIN = int(TokenAttr.CONTROL | TokenAttr.UNKNOWN)
_C_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale, which llama.cpp uses for stripping


@dataclass(frozen=True)
class _Special:
    token_id: int
    text: str
    lstrip: bool
    rstrip: bool


class SpecialSplitter:
    def __init__(self, vocab: Vocab):
        ids = [i for i, attr in enumerate(vocab.attrs) if attr & _SPECIAL]
        # Longest first; llama.cpp's sort leaves equal lengths unordered, we keep id order.
        ids.sort(key=lambda i: -len(vocab.tokens[i]))
        self.all = [_Special(i, vocab.tokens[i], bool(vocab.attrs[i] & TokenAttr.LSTRIP),
                             bool(vocab.attrs[i] & TokenAttr.RSTRIP)) for i in ids]
        self.user_defined = [s for s in self.all if not vocab.attrs[s.token_id] & _NOT_PLAIN]
        # what only parse_special splits out (Gemma 3: thousands of unused control tokens)
        self.control = [s for s in self.all if vocab.attrs[s.token_id] & _NOT_PLAIN]

    def holds_control_text(self, text: str) -> bool:
        """Whether text holds the text of a token that only parse_special splits out (a
        CONTROL or UNKNOWN token: <|im_start|>, <s>, ...)."""
        return any(s.text in text for s in self.control)

    def partition(self, text: str, parse_special: bool) -> list[str | int]:
        if not text:
            return []
        candidates = self.all if parse_special else self.user_defined
        fragments: list[str | int] = [text]
        # A substring test first: most texts hold few (or none) of thousands of candidates.
        for special in [s for s in candidates if s.text in text]:
            split: list[str | int] = []
            for fragment in fragments:
                if isinstance(fragment, str):
                    split.extend(_split_on(fragment, special))
                else:
                    split.append(fragment)
            fragments = split
        return fragments


def _split_on(fragment: str, special: _Special) -> list[str | int]:
    out: list[str | int] = []
    pos = 0
    while (match := fragment.find(special.text, pos)) >= 0:
        left_end = match
        if special.lstrip:
            while left_end > pos and fragment[left_end - 1] in _C_SPACE:
                left_end -= 1
        if left_end > pos:
            out.append(fragment[pos:left_end])
        out.append(special.token_id)
        pos = match + len(special.text)
        if special.rstrip:
            while pos < len(fragment) and fragment[pos] in _C_SPACE:
                pos += 1
    if pos < len(fragment):
        out.append(fragment[pos:] if pos else fragment)
    return out
