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
from itertools import chain

from .merge import merge_adjacent
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
    return merge_adjacent(symbols, lambda a, b: ranks.get((a, b)))
