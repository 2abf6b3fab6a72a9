"""GGUF file -> metadata dict + tensor table over a read-only memory map.

Input: a path to a (possibly hostile) GGUF v2/v3 file. Output: `GGUFFile` with `metadata`
(key -> int/float/bool/str, numeric arrays as numpy arrays, string arrays as lists of str),
`tensors` (name -> `TensorInfo`: ggml type, numpy-order shape, raw bytes as a uint8 view of the
map) and `tensor_bytes(name)`.

Every length and count read from the file is checked against the bytes that remain before it is
used, so a corrupt file fails with one `GGUFError` naming the file, the key or tensor and what was
expected; it never allocates more than the file's size or loops past its end. Tensors whose data
overlap are rejected. The `gguf` package's own `GGUFReader` is correct but builds a Python object
per vocab entry (5-25 s on the real models), which is why the header is parsed here with
struct/numpy in bulk.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4

# GGUF scalar value types -> little-endian numpy dtype
_SCALAR_DTYPES = {
    GGUFValueType.UINT8: np.dtype("<u1"), GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"), GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"), GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.UINT64: np.dtype("<u8"), GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT32: np.dtype("<f4"), GGUFValueType.FLOAT64: np.dtype("<f8"),
    GGUFValueType.BOOL: np.dtype("u1"),
}


class GGUFError(ValueError):
    """A GGUF file that cannot be used: names the file, the key or tensor, and what was expected."""

    def __init__(self, path, what: str, expected: str):
        self.path, self.what, self.expected = str(path), what, expected
        super().__init__(f"{path}: {what}: {expected}")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: `shape` in numpy order (rows, cols), i.e. ggml's ne reversed."""
    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int          # absolute byte offset in the file
    n_bytes: int
    data: np.ndarray     # uint8 view of the raw bytes (no copy)

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class _Cursor:
    """Bounds-checked little-endian reader over the mapped header."""

    def __init__(self, buf, path):
        self.buf, self.path, self.pos, self.size = buf, path, 0, len(buf)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(self.path, what, f"needs {n} bytes at offset {self.pos}, but the file "
                            f"ends at {self.size} (truncated or corrupt)")

    def unpack(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return values[0] if len(values) == 1 else values

    def string(self, what: str) -> str:
        n = self.unpack("<Q", what)
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(self.path, what, "expected a UTF-8 string") from None

    def array(self, dtype: np.dtype, count: int, what: str) -> np.ndarray:
        self.need(count * dtype.itemsize, what)
        out = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
        self.pos += count * dtype.itemsize
        return out


def _value_type(raw: int, path, key: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise GGUFError(path, f"key {key!r}", f"unknown value type {raw}") from None


def _read_value(cur: _Cursor, vtype: GGUFValueType, key: str, types: list):
    """The value at the cursor; appends its GGUF type (and element type) to `types`."""
    what = f"key {key!r}"
    types.append(vtype)
    if vtype in _SCALAR_DTYPES:
        dtype = _SCALAR_DTYPES[vtype]
        value = cur.array(dtype, 1, what)[0]
        return bool(value) if vtype == GGUFValueType.BOOL else value.item()
    if vtype == GGUFValueType.STRING:
        return cur.string(what)
    if vtype != GGUFValueType.ARRAY:
        raise GGUFError(cur.path, what, f"unsupported value type {vtype.name}")
    item_type = _value_type(cur.unpack("<I", what), cur.path, key)
    types.append(item_type)
    count = cur.unpack("<Q", what)
    if item_type in _SCALAR_DTYPES:
        values = cur.array(_SCALAR_DTYPES[item_type], count, what)
        return values.astype(bool) if item_type == GGUFValueType.BOOL else values
    if item_type != GGUFValueType.STRING:
        raise GGUFError(cur.path, what, f"arrays of {item_type.name} are not supported")
    cur.need(count * 8, what)  # each string has at least its 8-byte length
    return _string_array(cur, count, what)


def _string_array(cur: _Cursor, count: int, what: str) -> list[str]:
    """`count` length-prefixed strings; the hot loop of vocabularies (262k entries), kept lean.
    Token texts need not be valid UTF-8: surrogateescape keeps their bytes recoverable."""
    buf, pos, size, unpack = cur.buf, cur.pos, cur.size, struct.Struct("<Q").unpack_from
    out = []
    append = out.append
    for index in range(count):
        if pos + 8 > size:
            cur.pos = pos
            cur.need(8, f"{what}[{index}]")
        (n,) = unpack(buf, pos)
        end = pos + 8 + n
        if end > size:
            cur.pos = pos + 8
            cur.need(n, f"{what}[{index}]")
        append(buf[pos + 8:end].decode("utf-8", "surrogateescape"))
        pos = end
    cur.pos = pos
    return out


def _read_metadata(cur: _Cursor, kv_count: int) -> tuple[dict, dict]:
    """(key -> value, key -> [GGUFValueType, element type for arrays])."""
    cur.need(kv_count * 12, "metadata")  # key length (8) + value type (4) at least per entry
    metadata, value_types = {}, {}
    for index in range(kv_count):
        key = cur.string(f"metadata entry {index} key")
        vtype = _value_type(cur.unpack("<I", f"key {key!r}"), cur.path, key)
        if key in metadata:
            raise GGUFError(cur.path, f"key {key!r}", "appears twice; keys must be unique")
        value_types[key] = []
        metadata[key] = _read_value(cur, vtype, key, value_types[key])
    return metadata, value_types


def _read_tensor_infos(cur: _Cursor, count: int) -> list[tuple]:
    cur.need(count * 24, "tensor table")  # name length + n_dims + type + offset at least
    infos = []
    for index in range(count):
        name = cur.string(f"tensor {index} name")
        what = f"tensor {name!r}"
        n_dims = cur.unpack("<I", what)
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFError(cur.path, what, f"expected 1..{MAX_DIMS} dimensions, got {n_dims}")
        dims = [int(d) for d in cur.array(np.dtype("<u8"), n_dims, what)]
        raw_type, offset = cur.unpack("<IQ", what)
        infos.append((name, dims, raw_type, offset))
    return infos


def _ggml_type(raw: int, path, what: str) -> GGMLQuantizationType:
    try:
        ggml_type = GGMLQuantizationType(raw)
    except ValueError:
        ggml_type = None
    if ggml_type is None or ggml_type not in GGML_QUANT_SIZES:
        known = ", ".join(t.name for t in GGML_QUANT_SIZES)
        raise GGUFError(path, what, f"unknown tensor type {raw} (expected one of {known})")
    return ggml_type


def _make_tensor(buf, path, data_start: int, info: tuple, alignment: int) -> TensorInfo:
    name, dims, raw_type, rel_offset = info
    what = f"tensor {name!r}"
    ggml_type = _ggml_type(raw_type, path, what)
    block, block_bytes = GGML_QUANT_SIZES[ggml_type]
    if any(d <= 0 for d in dims) or dims[0] % block:
        raise GGUFError(path, what, f"shape {dims} (ggml order) invalid for {ggml_type.name}: "
                        f"dimensions must be positive and ne0 a multiple of {block}")
    n_elements = 1
    for d in dims:
        n_elements *= d
    n_bytes = n_elements // block * block_bytes
    offset = data_start + rel_offset
    if rel_offset % alignment:
        raise GGUFError(path, what, f"data offset {rel_offset} is not a multiple of the "
                        f"alignment {alignment}")
    if offset + n_bytes > len(buf):
        raise GGUFError(path, what, f"data [{offset}, {offset + n_bytes}) lies past the end of "
                        f"the file ({len(buf)} bytes): truncated file or corrupt offset")
    data = np.frombuffer(buf, dtype=np.uint8, count=n_bytes, offset=offset)
    return TensorInfo(name, ggml_type, tuple(reversed(dims)), offset, n_bytes, data)


def _check_no_overlap(tensors: dict, path) -> None:
    """Each tensor's bytes are its own: two tensors sharing bytes (a crafted offset) would
    alias one weight into another. llama.cpp requires each tensor's data to follow the
    previous one's; any order without overlap is accepted here."""
    ordered = sorted(tensors.values(), key=lambda t: t.offset)
    for before, after in zip(ordered, ordered[1:]):
        if after.offset < before.offset + before.n_bytes:
            raise GGUFError(path, f"tensor {after.name!r}", f"data [{after.offset}, "
                            f"{after.offset + after.n_bytes}) overlaps tensor {before.name!r} "
                            f"[{before.offset}, {before.offset + before.n_bytes}); each tensor's "
                            f"data must follow the previous one's")


def _alignment(metadata: dict, path) -> int:
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(path, "key 'general.alignment'", f"expected a power of two, got "
                        f"{alignment!r}")
    return alignment


class GGUFFile:
    """A parsed GGUF file. Keeps the file mapped while alive; tensors are views into the map."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._mmap = _map_file(self.path)
        buf = self._mmap
        cur = _Cursor(buf, self.path)
        if len(buf) < 4 or buf[:4] != GGUF_MAGIC:
            raise GGUFError(self.path, "header", f"not a GGUF file (expected magic {GGUF_MAGIC!r},"
                            f" found {bytes(buf[:4])!r})")
        cur.pos = 4
        self.version = cur.unpack("<I", "header version")
        if self.version not in SUPPORTED_VERSIONS:
            raise GGUFError(self.path, "header version", f"expected one of {SUPPORTED_VERSIONS},"
                            f" got {self.version}")
        tensor_count, kv_count = cur.unpack("<QQ", "header counts")
        self.metadata, self.value_types = _read_metadata(cur, kv_count)
        infos = _read_tensor_infos(cur, tensor_count)
        self.alignment = _alignment(self.metadata, self.path)
        data_start = -(-cur.pos // self.alignment) * self.alignment
        self.tensors: dict[str, TensorInfo] = {}
        for info in infos:
            if info[0] in self.tensors:
                raise GGUFError(self.path, f"tensor {info[0]!r}", "appears twice")
            self.tensors[info[0]] = _make_tensor(buf, self.path, data_start, info, self.alignment)
        _check_no_overlap(self.tensors, self.path)

    @property
    def architecture(self) -> str:
        return self.require("general.architecture", str)

    def require(self, key: str, kind: type | tuple = object):
        """The value of metadata `key`; GGUFError when it is absent or of the wrong kind."""
        if key not in self.metadata:
            raise GGUFError(self.path, f"key {key!r}", "missing (required for this model)")
        return self._check_kind(key, self.metadata[key], kind)

    def get(self, key: str, default=None, kind: type | tuple = object):
        if key not in self.metadata:
            return default
        return self._check_kind(key, self.metadata[key], kind)

    def _check_kind(self, key, value, kind):
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if kind is int and isinstance(value, bool):
            kind = ()  # a bool where a count is expected is a type error
        if not isinstance(value, kind):
            names = kind.__name__ if isinstance(kind, type) else "a valid type"
            raise GGUFError(self.path, f"key {key!r}", f"expected {names}, got "
                            f"{type(value).__name__}")
        return value

    def tensor(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise GGUFError(self.path, f"tensor {name!r}", "missing (required for this model)")
        return self.tensors[name]

    def close(self) -> None:
        self.tensors = {}
        try:
            self._mmap.close()
        except BufferError:  # numpy views still alive; the map closes when they are freed
            pass


def _map_file(path: Path) -> mmap.mmap:
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size == 0:
                raise GGUFError(path, "header", "not a GGUF file (the file is empty)")
            return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise GGUFError(path, "file", f"cannot be read ({exc.strerror or exc})") from None
