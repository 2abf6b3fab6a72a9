"""SentencePiece-style BPE (tokenizer.ggml.model = "llama"): plain text fragment -> token ids.

Input: a text fragment without special tokens, with spaces already written as U+2581 (and the
prefix space added by the caller where add_space_prefix asks for it).
Output: token ids, as llama.cpp's SPM session produces them: start from single characters,
repeatedly merge the adjacent pair whose concatenation is a token with the highest score
(leftmost on ties), then emit each remaining piece's token; a piece that is no token (only single
characters can be: every merge makes a token) becomes one <0xXX> byte token per UTF-8 byte.
"""
from __future__ import annotations

import heapq

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
        n = len(symbols)
        if n < 2:
            return symbols
        next_index = list(range(1, n + 1))
        next_index[-1] = -1
        prev_index = list(range(-1, n - 1))
        alive: list[str | None] = list(symbols)
        heap: list = []
        for i in range(n - 1):
            self._push(heap, i, symbols[i], symbols[i + 1])
        heapq.heapify(heap)
        while heap:
            _, left, merged = heapq.heappop(heap)
            right = next_index[left]
            # Stale once either side has changed since the entry was pushed.
            if alive[left] is None or right < 0 or alive[left] + alive[right] != merged:
                continue
            alive[left] = merged
            alive[right] = None
            next_index[left] = next_index[right]
            if next_index[left] >= 0:
                prev_index[next_index[left]] = left
            before, after = prev_index[left], next_index[left]
            if before >= 0:
                self._push(heap, before, alive[before], merged, heapq.heappush)
            if after >= 0:
                self._push(heap, left, merged, alive[after], heapq.heappush)
        return [s for s in alive if s is not None]

    def _push(self, heap: list, left: int, a: str, b: str, push=list.append) -> None:
        token_id = self.token_to_id.get(a + b)
        if token_id is not None:
            # Max-heap on score via negation; equal scores pop the leftmost pair first.
            push(heap, (-self.scores[token_id], left, a + b))

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
