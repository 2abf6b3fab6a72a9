"""`GGUFFile` metadata -> a `gguf.GGUFReader`-compatible object, without re-parsing the file.

Input: a parsed `GGUFFile`. Output: `MetadataReader`, a GGUFReader whose `fields` hold
`ReaderField`s with the same `types` and `contents()` as gguf-py's (string arrays: one part per
string, indexed by `data`; numeric arrays: one part with all elements), so code written for
GGUFReader (the tokenizer's loader) reads it as is.
It carries no tensors. Building it takes ~0.1-0.3 s where GGUFReader needs 5-25 s on the real
models' large vocabularies.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.gguf_reader import ReaderField

from llm.gguf_file import _SCALAR_DTYPES, GGUFFile


class _Bytes(bytes):
    """A string's bytes, with numpy's `tobytes()` so `ReaderField.contents()` works on it
    (a bytes object is ~5x cheaper to create than a numpy array; vocabularies have 262k)."""

    def tobytes(self) -> bytes:
        return bytes(self)


def _string_part(text: str) -> _Bytes:
    return _Bytes(text.encode("utf-8", "surrogateescape"))


def _field(key: str, value, types: list[GGUFValueType]) -> ReaderField:
    main = types[0]
    if main == GGUFValueType.STRING:
        return ReaderField(0, key, [_string_part(value)], [0], list(types))
    if main != GGUFValueType.ARRAY:
        return ReaderField(0, key, [np.array([value], dtype=_SCALAR_DTYPES[main])], [0],
                           list(types))
    if types[1] == GGUFValueType.STRING:
        parts = [_string_part(text) for text in value]
        return ReaderField(0, key, parts, list(range(len(parts))), list(types))
    # numeric arrays: one part holding every element (gguf-py has one part per element; the
    # values, `contents()` and concatenating the parts of `data` give the same result)
    arr = np.asarray(value, dtype=_SCALAR_DTYPES[types[1]])
    return ReaderField(0, key, [arr], [0] if arr.size else [], list(types))


class MetadataReader(GGUFReader):
    """A GGUFReader over already-parsed metadata (no tensors)."""

    def __init__(self, gguf: GGUFFile):  # deliberately not calling GGUFReader.__init__
        self.data = np.memmap(gguf.path, dtype=np.uint8, mode="r")
        self.fields = OrderedDict(
            (key, _field(key, value, gguf.value_types[key]))
            for key, value in gguf.metadata.items())
        self.tensors = []
