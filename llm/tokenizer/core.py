"""Tokenizer: text <-> token ids for a GGUF vocabulary, with llama.cpp's results.

Input: a GGUF file (path or gguf.GGUFReader; vocab-only files work).
Output: `encode(text) -> ids`, `decode(ids) -> text`, per-token pieces (bytes), an incremental
UTF-8-safe stream decoder and the special ids (bos, eos, eot, end-of-generation set).
"""
from __future__ import annotations

import codecs
import os
from typing import Sequence

from gguf import GGUFReader

from .bpe import BpeEncoder
from .pretokenize import CHAR_TO_BYTE
from .special import SpecialSplitter
from .spm import SpmEncoder
from .vocab import TokenAttr, Vocab, load_vocab

_HIDDEN_UNLESS_SPECIAL = int(TokenAttr.CONTROL | TokenAttr.UNKNOWN)
_USER_DEFINED, _NORMAL, _BYTE = (int(TokenAttr.USER_DEFINED), int(TokenAttr.NORMAL),
                                 int(TokenAttr.BYTE))
_SPM_SPACE = "\u2581"


class Tokenizer:
    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self._special = SpecialSplitter(vocab)
        self._bpe = BpeEncoder(vocab) if vocab.model == "gpt2" else None
        self._spm = SpmEncoder(vocab) if vocab.model == "llama" else None
        self._pieces: dict[int, bytes] = {}

    @classmethod
    def from_gguf(cls, source: str | os.PathLike | GGUFReader) -> "Tokenizer":
        return cls(load_vocab(source))

    # ---- special ids -------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return len(self.vocab)

    @property
    def bos_id(self) -> int | None:
        return self.vocab.special["bos"]

    @property
    def eos_id(self) -> int | None:
        return self.vocab.special["eos"]

    @property
    def eot_id(self) -> int | None:
        return self.vocab.special["eot"]

    @property
    def eog_ids(self) -> set[int]:
        return set(self.vocab.eog_ids)

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.vocab.eog_ids

    # ---- encode ------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of text; add_special adds BOS/EOS where the vocab asks for them."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, not {type(text).__name__}")
        return self._encode_fragments(self._special.partition(text, parse_special), add_special)

    def encode_parts(self, parts: Sequence[tuple[str, bool]], add_special: bool = True
                     ) -> list[int]:
        """Token ids of the texts of parts joined, each (text, parse_special) searched for
        control tokens only where its flag says (a chat prompt: the template's text parsed,
        the messages' contents plain). The plain text on either side of a part's edge is
        tokenized as one, so parts with no control text give encode(joined text)'s ids."""
        fragments: list[str | int] = []
        for text, parse_special in parts:
            for fragment in self._special.partition(text, parse_special):
                if isinstance(fragment, str) and fragments and isinstance(fragments[-1], str):
                    fragments[-1] += fragment
                else:
                    fragments.append(fragment)
        return self._encode_fragments(fragments, add_special)

    def holds_control_text(self, text: str) -> bool:
        """Whether encode(text, parse_special=True) would find a control token in text."""
        return self._special.holds_control_text(text)

    def _encode_fragments(self, fragments: list[str | int], add_special: bool) -> list[int]:
        ids: list[int] = []
        if add_special and self.vocab.add_bos:
            ids.append(self._required("bos"))
        if self._spm is not None:
            self._encode_spm(fragments, ids)
        else:
            for fragment in fragments:
                if isinstance(fragment, int):
                    ids.append(fragment)
                else:
                    ids.extend(self._bpe.encode(fragment))
        if add_special and self.vocab.add_eos:
            ids.append(self._required("eos"))
        return ids

    def _encode_spm(self, fragments: list[str | int], ids: list[int]) -> None:
        # llama.cpp prefixes a space to the first plain fragment and to every plain fragment
        # that follows a special token (when add_space_prefix is set).
        after_special = True
        for fragment in fragments:
            if isinstance(fragment, int):
                ids.append(fragment)
                after_special = True
                continue
            if self.vocab.add_space_prefix and after_special:
                fragment = " " + fragment
            ids.extend(self._spm.encode(fragment.replace(" ", _SPM_SPACE)))
            after_special = False

    def _required(self, name: str) -> int:
        token_id = self.vocab.special[name]
        if token_id is None:
            raise ValueError(f"{self.vocab.path}: the vocab asks for a {name.upper()} token "
                             f"(tokenizer.ggml.add_{name}_token) but has no "
                             f"tokenizer.ggml.{name}_token_id")
        return token_id

    # ---- decode ------------------------------------------------------------------------
    def token_to_piece(self, token_id: int, special: bool = True) -> bytes:
        """Raw bytes of one token; control/unknown tokens give b"" unless special."""
        attr = self._attr(token_id)
        if not special and attr & _HIDDEN_UNLESS_SPECIAL:
            return b""
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self._piece_bytes(token_id, attr)
        return piece

    def _attr(self, token_id: int) -> int:
        if not isinstance(token_id, int) or not 0 <= token_id < len(self.vocab):
            raise ValueError(f"token id {token_id!r} is out of range for the vocab of "
                             f"{self.vocab.path} ({len(self.vocab)} tokens)")
        return self.vocab.attrs[token_id]

    def _piece_bytes(self, token_id: int, attr: int) -> bytes:
        text = self.vocab.tokens[token_id]
        if attr & (_HIDDEN_UNLESS_SPECIAL | _USER_DEFINED):
            return _utf8(text)
        if attr & _NORMAL:
            if self._spm is not None:
                return _utf8(text.replace(_SPM_SPACE, " "))
            # Byte-level characters back to bytes; a character outside GPT-2's table (a
            # malformed vocab) stays as its own UTF-8.
            return b"".join(bytes([CHAR_TO_BYTE[c]]) if c in CHAR_TO_BYTE else _utf8(c)
                            for c in text)
        if attr & _BYTE:
            return _byte_token_value(self.vocab.path, token_id, text)
        return b""  # unused / undefined tokens render as nothing, as in llama.cpp

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        """Text of ids; invalid UTF-8 (e.g. a truncated byte sequence) becomes U+FFFD."""
        pieces = [self.token_to_piece(int(i), special=not skip_special) for i in ids]
        # As llama.cpp's detokenize: with add_space_prefix the first token's leading space
        # (the one encode added) is dropped.
        if pieces and self.vocab.add_space_prefix and pieces[0].startswith(b" "):
            pieces[0] = pieces[0][1:]
        return b"".join(pieces).decode("utf-8", "replace")

    def pieces(self, ids: list[int]) -> list[str]:
        """Each token's text alone (for display); partial UTF-8 shows as U+FFFD."""
        return [self.token_to_piece(int(i)).decode("utf-8", "replace") for i in ids]

    def stream_decoder(self, skip_special: bool = False) -> "StreamDecoder":
        return StreamDecoder(self, skip_special)


class StreamDecoder:
    """Incremental decode: add(id) returns only complete UTF-8 text, holding partial bytes."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tokenizer = tokenizer
        self._special = not skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id: int) -> str:
        return self._utf8.decode(self._tokenizer.token_to_piece(token_id, self._special))

    def flush(self) -> str:
        """Whatever is held back (an incomplete sequence becomes U+FFFD); resets the state."""
        return self._utf8.decode(b"", final=True)


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _byte_token_value(path: str, token_id: int, text: str) -> bytes:
    """A byte token's text is <0xXX>."""
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        try:
            return bytes([int(text[3:5], 16)])
        except ValueError:
            pass
    raise ValueError(f"{path}: byte token {token_id} has text {text!r}, expected <0xXX>")
