"""A structure-aware GGUF mutator: a valid GGUF file + a seeded generator -> a hostile variant.

`layout(data)` walks a trusted file once and records where every header field lies (counts,
string lengths, value and tensor types, dimensions, data offsets, scalar values, tensor data);
`mutate(data, rng)` applies one to three of the mutations below at those places and returns the
new bytes with a description of what it did (for the failure report):

    truncate      cut the file anywhere (mostly inside the header)
    huge          a count, length or dimension set to 0, +-1, 2^32, 2^40, 2^63, 2^64-1, file size
    type          a value type, array element type or tensor type swapped for another (or junk)
    offset        a tensor's data offset moved onto another's, unaligned, past the end
    value         a scalar hyperparameter set to NaN, Inf, 0, -1, or a huge integer
    elements      elements of a numeric array (token types, scores) set to the same extremes
    nan           a tensor's bytes overwritten with 0xff (NaN in f32, f16 and block scales)
    string        a string's length past the end of the file, or its bytes made invalid UTF-8
    bytes         a few header bytes flipped at random
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

# GGUF value types (gguf.GGUFValueType): scalar type -> byte size
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_FLOAT_FORMATS = {6: "<f", 12: "<d"}
_INT_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 10: "<Q", 11: "<q"}
_HUGE = (0, 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**63 - 1, 2**63, 2**64 - 1)


@dataclass
class Layout:
    """Byte offsets of a GGUF file's fields (each a (offset, struct format) pair)."""
    counts: list = field(default_factory=list)      # tensor/kv counts, array counts, n_dims
    lengths: list = field(default_factory=list)     # string lengths (u64)
    types: list = field(default_factory=list)       # value and array element types (u32)
    dims: list = field(default_factory=list)        # tensor dimensions (u64)
    tensor_types: list = field(default_factory=list)
    offsets: list = field(default_factory=list)     # tensor data offsets (u64)
    scalars: list = field(default_factory=list)     # (offset, value type) of scalar values
    strings: list = field(default_factory=list)     # (offset, length) of string bytes
    arrays: list = field(default_factory=list)      # (offset, count, type) of numeric arrays
    data_start: int = 0
    header_end: int = 0


class _Walker:
    def __init__(self, data: bytes, out: Layout):
        self.data, self.pos, self.out = data, 0, out

    def take(self, fmt: str, into: list | None = None):
        if into is not None:
            into.append((self.pos, fmt))
        value = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> None:
        n = self.take("<Q", self.out.lengths)
        self.out.strings.append((self.pos, n))
        self.pos += n

    def value(self, vtype: int) -> None:
        if vtype == _STRING:
            self.string()
        elif vtype == _ARRAY:
            item = self.take("<I", self.out.types)
            count = self.take("<Q", self.out.counts)
            if item in (_STRING, _ARRAY):
                for _ in range(count):
                    self.value(item)
            else:
                self.out.arrays.append((self.pos, count, item))
                self.pos += count * _SCALAR_SIZES[item]
        else:
            self.out.scalars.append((self.pos, vtype))
            self.pos += _SCALAR_SIZES[vtype]


def layout(data: bytes) -> Layout:
    """Field offsets of a well-formed GGUF v3 file (the mutator's input, never a hostile one)."""
    out = Layout()
    w = _Walker(data, out)
    w.pos = 8                                        # magic, version
    n_tensors = w.take("<Q", out.counts)
    n_kv = w.take("<Q", out.counts)
    alignment = 32
    for _ in range(n_kv):
        key_at = w.pos + 8
        w.string()
        vtype = w.take("<I", out.types)
        if data[key_at:w.pos - 4] == b"general.alignment":
            alignment = struct.unpack_from("<I", data, w.pos)[0]
        w.value(vtype)
    for _ in range(n_tensors):
        w.string()
        n_dims = w.take("<I", out.counts)
        for _ in range(n_dims):
            w.take("<Q", out.dims)
        w.take("<I", out.tensor_types)
        w.take("<Q", out.offsets)
    out.header_end = w.pos
    out.data_start = -(-w.pos // alignment) * alignment
    return out


def _put(buf: bytearray, at: int, fmt: str, value) -> None:
    if at + struct.calcsize(fmt) <= len(buf):
        struct.pack_into(fmt, buf, at, value)


def _pick(rng: np.random.Generator, items: list):
    return items[int(rng.integers(len(items)))]


def _truncate(buf, lay, rng):
    end = lay.header_end if rng.random() < 0.7 else len(buf)
    cut = int(rng.integers(0, max(end, 1)))
    del buf[cut:]
    return f"truncate at {cut}"


def _huge(buf, lay, rng):
    at, fmt = _pick(rng, _pick(rng, [lay.counts, lay.lengths, lay.dims]))  # not mostly vocab
    old = struct.unpack_from(fmt, buf, at)[0]
    limit = 2 ** (8 * struct.calcsize(fmt))
    value = _pick(rng, list(_HUGE) + [old + 1, old - 1, len(buf), len(buf) + 1]) % limit
    _put(buf, at, fmt, value)
    return f"huge: field at {at} {old} -> {value}"


def _type(buf, lay, rng):
    at, fmt = _pick(rng, lay.types + lay.tensor_types)
    value = int(rng.integers(0, 45)) if rng.random() < 0.9 else 2**31 + 7
    _put(buf, at, fmt, value)
    return f"type: field at {at} -> {value}"


def _offset(buf, lay, rng):
    at, _ = _pick(rng, lay.offsets)
    other = struct.unpack_from("<Q", buf, _pick(rng, lay.offsets)[0])[0]
    value = _pick(rng, [other, other + 32, other + 1, other - 32, 0, 2**63, len(buf)]) % 2**64
    _put(buf, at, "<Q", value)
    return f"offset: tensor offset at {at} -> {value}"


def _value(buf, lay, rng, at_type=None):
    at, vtype = at_type or _pick(rng, lay.scalars)
    if vtype in _FLOAT_FORMATS:
        value = _pick(rng, [float("nan"), float("inf"), -float("inf"), 0.0, -1.0, 1e38, 1e-45])
        _put(buf, at, _FLOAT_FORMATS[vtype], value)
    elif vtype in _INT_FORMATS:
        bits = 8 * struct.calcsize(_INT_FORMATS[vtype])
        signed = _INT_FORMATS[vtype].islower()
        value = _pick(rng, [0, 1, 2**(bits - 1) - 1, 2**bits - 1, 255, 65535])
        value = value - 2**bits if signed and value >= 2**(bits - 1) else value
        _put(buf, at, _INT_FORMATS[vtype], value)
    else:
        value = int(rng.integers(0, 256))
        buf[at] = value
    return f"value: scalar at {at} (type {vtype}) -> {value}"


def _elements(buf, lay, rng):
    arrays = [a for a in lay.arrays if a[1]]
    if not arrays:
        return _value(buf, lay, rng)
    start, count, item = _pick(rng, arrays)
    picked = rng.integers(count, size=int(rng.integers(1, 17)))
    return "elements: " + "; ".join(
        _value(buf, lay, rng, (start + int(i) * _SCALAR_SIZES[item], item)) for i in picked)


def _nan(buf, lay, rng):
    start = int(rng.integers(lay.data_start, max(len(buf), lay.data_start + 1)))
    stop = min(len(buf), start + int(rng.integers(1, 4096)))
    buf[start:stop] = b"\xff" * (stop - start)
    return f"nan: bytes [{start}, {stop}) set to 0xff"


def _string(buf, lay, rng):
    if rng.random() < 0.5:
        at, _ = _pick(rng, lay.lengths)
        value = _pick(rng, [len(buf) - at, len(buf) - at - 7, 2**63, 2**64 - 1, 2**40])
        _put(buf, at, "<Q", value)
        return f"string: length at {at} -> {value}"
    start, n = _pick(rng, [s for s in lay.strings if s[1]] or lay.strings)
    if n:
        buf[start + int(rng.integers(n))] = 0xff
    return f"string: invalid UTF-8 at {start}"


def _bytes(buf, lay, rng):
    spots = rng.integers(4, max(min(lay.header_end, len(buf)), 5), size=int(rng.integers(1, 6)))
    spots = spots[spots < len(buf)]
    for at in spots:
        buf[int(at)] = int(rng.integers(256))
    return f"bytes: flipped at {sorted(int(s) for s in spots)}"


MUTATIONS = {"truncate": _truncate, "huge": _huge, "type": _type, "offset": _offset,
             "value": _value, "elements": _elements, "nan": _nan, "string": _string,
             "bytes": _bytes}


def mutate(data: bytes, rng: np.random.Generator) -> tuple[bytes, list[str]]:
    """A mutated copy of data and one description per mutation applied (1 to 3 of them, the
    layout taken from the original: later mutations may land in fields an earlier one broke,
    as compound corruption does)."""
    lay = layout(data)
    buf = bytearray(data)
    names = [_pick(rng, list(MUTATIONS)) for _ in range(int(rng.integers(1, 4)))]
    names.sort(key=lambda name: name == "truncate")  # truncate last: the others land first
    done = [MUTATIONS[name](buf, lay, rng) for name in names]
    return bytes(buf), done
