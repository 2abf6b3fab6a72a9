"""Byte-level BPE (tokenizer.ggml.model = "gpt2"): plain text fragment -> token ids.

Input: a text fragment without special tokens.
Output: token ids, as llama.cpp's BPE session produces them:
  1. pre-tokenize into words (pretokenize.Splitter, per tokenizer.ggml.pre);
  2. write each word's UTF-8 bytes as GPT-2 byte-level characters;
  3. with ignore_merges (llama3 family), a word that is itself a token is that token;
  4. otherwise start from single characters and repeatedly merge the adjacent pair with the
     lowest merge rank (leftmost on ties);
  5. look up each final symbol; a symbol without a token falls back to one token per byte of
     its UTF-8 text, where such a one-byte token exists (others are dropped, as in llama.cpp).
Words repeat a lot in real text, so word -> ids goes through an LRU cache.
"""
from __future__ import annotations

import functools
import heapq
from itertools import chain

from .pretokenize import Splitter, byte_encode
from .vocab import Vocab

WORD_CACHE_SIZE = 1 << 16


class BpeEncoder:
    def __init__(self, vocab: Vocab, cache_size: int = WORD_CACHE_SIZE):
        assert vocab.pre_tokenizer is not None
        self.token_to_id = vocab.token_to_id
        self.ranks = vocab.merges
        self.splitter = Splitter(vocab.pre_tokenizer.regex_set)
        self.ignore_merges = vocab.pre_tokenizer.ignore_merges
        self.word_ids = functools.lru_cache(maxsize=cache_size)(self._word_ids)

    def encode(self, text: str) -> list[int]:
        return list(chain.from_iterable(map(self.word_ids, self.splitter.split(text))))

    def _word_ids(self, word: str) -> tuple[int, ...]:
        encoded = byte_encode(word)
        lookup = self.token_to_id
        if self.ignore_merges and encoded in lookup:
            return (lookup[encoded],)
        ids = []
        for symbol in merge_symbols(list(encoded), self.ranks):
            token_id = lookup.get(symbol)
            if token_id is not None:
                ids.append(token_id)
                continue
            for byte in symbol.encode("utf-8", "surrogateescape"):
                # the one-byte string llama.cpp looks up (a non-ASCII byte alone can only be
                # a token of a file with invalid UTF-8, which the vocab keeps surrogate-escaped)
                byte_text = chr(byte) if byte < 0x80 else chr(0xDC00 + byte)
                if byte_text in lookup:
                    ids.append(lookup[byte_text])
        return tuple(ids)


def merge_symbols(symbols: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """Apply BPE merges: lowest rank first, leftmost first among equal ranks."""
    n = len(symbols)
    if n < 2:
        return symbols
    next_index = list(range(1, n + 1))
    next_index[-1] = -1
    prev_index = list(range(-1, n - 1))
    heap = []
    for i in range(n - 1):
        rank = ranks.get((symbols[i], symbols[i + 1]))
        if rank is not None:
            heap.append((rank, i, symbols[i] + symbols[i + 1]))
    heapq.heapify(heap)
    alive: list[str | None] = list(symbols)
    while heap:
        _, left, merged = heapq.heappop(heap)
        right = next_index[left]
        # An entry is stale once either side has changed since it was pushed.
        if alive[left] is None or right < 0 or alive[left] + alive[right] != merged:
            continue
        alive[left] = merged
        alive[right] = None
        next_index[left] = next_index[right]
        if next_index[left] >= 0:
            prev_index[next_index[left]] = left
        for a in (prev_index[left], left):
            b = next_index[a] if a >= 0 else -1
            if a >= 0 and b >= 0:
                rank = ranks.get((alive[a], alive[b]))
                if rank is not None:
                    heapq.heappush(heap, (rank, a, alive[a] + alive[b]))
    return [s for s in alive if s is not None]
