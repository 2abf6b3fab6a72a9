"""SentencePiece-style BPE (tokenizer.ggml.model = "llama"): plain text fragment -> token ids.

Input: a text fragment without special tokens, with spaces already written as U+2581 (and the
prefix space added by the caller where add_space_prefix asks for it).
Output: token ids, as llama.cpp's SPM session produces them: start from single characters,
repeatedly merge the adjacent pair whose concatenation is a token with the highest score
(leftmost on ties), then emit each remaining piece's token; a piece that is no token (only single
characters can be: every merge makes a token) becomes one <0xXX> byte token per UTF-8 byte.
"""
from __future__ import annotations

from .merge import merge_adjacent
from .vocab import Vocab


class SpmEncoder:
    def __init__(self, vocab: Vocab):
        self.path = vocab.path
        self.token_to_id = vocab.token_to_id
        self.scores = vocab.scores.tolist()
        self.unk_id = vocab.special.get("unk")
        self._byte_ids: dict[int, int] = {}

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        lookup = self.token_to_id
        for piece in self._merge(list(text)):
            token_id = lookup.get(piece)
            if token_id is not None:
                out.append(token_id)
            else:
                out.extend(self.byte_id(b) for b in piece.encode("utf-8", "surrogatepass"))
        return out

    def _merge(self, symbols: list[str]) -> list[str]:
        return merge_adjacent(symbols, self._priority)

    def _priority(self, a: str, b: str):
        token_id = self.token_to_id.get(a + b)
        # Highest score first (negated for the min-heap); ties pop the leftmost pair.
        return None if token_id is None else -self.scores[token_id]

    def byte_id(self, byte: int) -> int:
        token_id = self._byte_ids.get(byte)
        if token_id is None:
            token_id = self.token_to_id.get(f"<0x{byte:02X}>")
            if token_id is None:
                token_id = self.token_to_id.get(chr(byte) if byte < 0x80 else chr(0xDC00 + byte))
            if token_id is None:
                token_id = self.unk_id
            if token_id is None:
                raise ValueError(f"{self.path}: the vocab has no byte token <0x{byte:02X}> "
                                 "and no unknown token to stand for it")
            self._byte_ids[byte] = token_id
        return token_id
