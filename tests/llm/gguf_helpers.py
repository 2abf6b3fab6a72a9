"""Test helpers: rewrite a GGUF file with keys/tensors added, changed or dropped (gguf.GGUFWriter),
and locate header fields so tests can corrupt single bytes."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
from gguf import GGUFValueType, GGUFWriter

from llm.gguf_file import GGUFFile
from tests.shared_data import GOLDEN, require

TINY = GOLDEN / "tiny"
TINY_LLAMA = TINY / "tiny-llama-f32.gguf"


def require_for_module(path: Path) -> None:
    """Fail at collection, naming the file, when oracle data is absent from tests/data."""
    require(path)


def rewrite(src: Path, dst: Path, set_keys: dict | None = None, drop_keys=(),
            tensors: dict | None = None, drop_tensors=()) -> Path:
    """Copy src to dst through GGUFWriter. set_keys: key -> (value, GGUFValueType[, sub_type]);
    tensors: name -> (float32 or raw uint8 ndarray, raw ggml type or None)."""
    g = GGUFFile(src)
    set_keys = dict(set_keys or {})
    arch = set_keys.pop("general.architecture", (g.metadata["general.architecture"],))[0]
    writer = GGUFWriter(str(dst), arch)
    for key, value in g.metadata.items():
        if key in drop_keys or key == "general.architecture" or key in set_keys:
            continue
        types = g.value_types[key]
        writer.add_key_value(key, value if not isinstance(value, np.ndarray) else value.tolist(),
                             types[0], types[1] if len(types) > 1 else None)
    for key, spec in set_keys.items():
        writer.add_key_value(key, *spec)
    tensors = dict(tensors or {})
    for name, t in g.tensors.items():
        if name in drop_tensors or name in tensors:
            continue
        writer.add_tensor(name, t.data.view(np.float32).reshape(t.shape).copy())
    for name, (array, raw_type) in tensors.items():
        writer.add_tensor(name, array, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def tensor_info_offset(path: Path, name: str) -> int:
    """Byte offset of the n_dims field of tensor `name`'s header entry."""
    data = Path(path).read_bytes()
    encoded = name.encode()
    pos = data.find(struct.pack("<Q", len(encoded)) + encoded)
    assert pos >= 0, name
    return pos + 8 + len(encoded)


def key_value_offset(path: Path, key: str) -> int:
    """Byte offset of the value-type field following metadata key `key`."""
    data = Path(path).read_bytes()
    encoded = key.encode()
    pos = data.find(struct.pack("<Q", len(encoded)) + encoded)
    assert pos >= 0, key
    return pos + 8 + len(encoded)


def patch(path: Path, offset: int, fmt: str, *values) -> None:
    data = bytearray(Path(path).read_bytes())
    struct.pack_into(fmt, data, offset, *values)
    Path(path).write_bytes(bytes(data))


__all__ = ["GGUFValueType", "GOLDEN", "TINY", "TINY_LLAMA", "key_value_offset", "patch", "require",
           "require_for_module", "rewrite", "tensor_info_offset"]
