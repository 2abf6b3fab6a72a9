"""`GGUFFile` metadata -> a `gguf.GGUFReader`-compatible object, without re-parsing the file.

Input: a parsed `GGUFFile`. Output: `MetadataReader`, a GGUFReader whose `fields` hold the same
`ReaderField` layout gguf-py builds (one part per array element, `data` indexing them, `types`
with the element type) so code written for GGUFReader (the tokenizer's loader) reads it as is.
It carries no tensors. Building it takes ~0.1-0.3 s where GGUFReader needs 5-25 s on the real
models' large vocabularies.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.gguf_reader import ReaderField

from llm.gguf_file import _SCALAR_DTYPES, GGUFFile


def _string_part(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8", "surrogateescape"), dtype=np.uint8)


def _field(key: str, value, types: list[GGUFValueType]) -> ReaderField:
    main = types[0]
    if main == GGUFValueType.STRING:
        return ReaderField(0, key, [_string_part(value)], [0], list(types))
    if main != GGUFValueType.ARRAY:
        return ReaderField(0, key, [np.array([value], dtype=_SCALAR_DTYPES[main])], [0],
                           list(types))
    if types[1] == GGUFValueType.STRING:
        parts = [_string_part(text) for text in value]
    else:
        arr = np.asarray(value, dtype=_SCALAR_DTYPES[types[1]])
        parts = [arr[i:i + 1] for i in range(arr.shape[0])]
    return ReaderField(0, key, parts, list(range(len(parts))), list(types))


class MetadataReader(GGUFReader):
    """A GGUFReader over already-parsed metadata (no tensors)."""

    def __init__(self, gguf: GGUFFile):  # deliberately not calling GGUFReader.__init__
        self.data = np.memmap(gguf.path, dtype=np.uint8, mode="r")
        self.fields = OrderedDict(
            (key, _field(key, value, gguf.value_types[key]))
            for key, value in gguf.metadata.items())
        self.tensors = []
