"""Parameter buffers: where one launch's packed arguments live until the driver has copied them.

Input: a packer's layout (each field's byte offset in the device-side parameter layout, the
total size). Output: `new_buffer(offsets, size)` -> (storage, base, params, extra):
- `storage`: one ctypes object owning all of it (keep it alive while the addresses are used);
- `base`: the byte offset inside `storage` where the fields start (`struct.pack_into(storage,
  base, ...)`); the start is 16-byte aligned in memory (what matters to the driver is each
  field's offset from the start: the packer aligns those per the ABI);
- `params`: the address of a void*[] pointing at each field (cuLaunchKernel's kernelParams);
- `extra`: the address of {CU_LAUNCH_PARAM_BUFFER_POINTER, start, CU_LAUNCH_PARAM_BUFFER_SIZE,
  &size, CU_LAUNCH_PARAM_END}: the same bytes handed over as one buffer (`extra`).
Both addresses are 0 (NULL) for a kernel without parameters.

`BufferPool`: the free buffers of one layout, so that launches made from several threads at
once never pack into one buffer: a launch takes one (a single `list.pop`, atomic), packs into
it, calls the driver (which copies the parameters before it returns, also while a stream is
being captured) and gives it back; a launch that finds the pool empty (another thread holds
the buffer) makes a new one, which joins the pool when given back.
"""
from __future__ import annotations

import ctypes
import functools

# cuda.h's CU_LAUNCH_PARAM_* markers of an `extra` array (the driver reads them as void*)
LAUNCH_PARAM_END, LAUNCH_PARAM_BUFFER_POINTER, LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2
_ALIGN = 16


def new_buffer(offsets: list, size: int) -> tuple:
    """(storage, base, params, extra) for fields at `offsets` in `size` bytes (module doc)."""
    Storage = _storage_type(len(offsets), size)
    storage = Storage()
    start = Storage.bytes.offset
    base = start + (-(ctypes.addressof(storage) + start)) % _ALIGN
    address = ctypes.addressof(storage) + base
    if not offsets:
        return storage, base, 0, 0
    storage.size = size
    storage.pointers[:len(offsets)] = [address + offset for offset in offsets]
    storage.extra[:] = [LAUNCH_PARAM_BUFFER_POINTER, address, LAUNCH_PARAM_BUFFER_SIZE,
                        ctypes.addressof(storage) + Storage.size.offset, LAUNCH_PARAM_END]
    return (storage, base, ctypes.addressof(storage) + Storage.pointers.offset,
            ctypes.addressof(storage) + Storage.extra.offset)


@functools.lru_cache(maxsize=256)
def _storage_type(count: int, size: int):
    """The ctypes layout of a buffer (a class per layout: making one costs ~30 us)."""
    class Storage(ctypes.Structure):
        _fields_ = [("extra", ctypes.c_void_p * 5), ("size", ctypes.c_size_t),
                    ("pointers", ctypes.c_void_p * max(1, count)),
                    ("bytes", ctypes.c_uint8 * (size + _ALIGN))]
    return Storage


class BufferPool:
    """Free buffers of one layout (see the module docstring). `take` and `give` are the list's
    own pop and append: the generated launchers call them directly."""

    def __init__(self, offsets: list, size: int):
        self.offsets, self.size = list(offsets), size
        self.free = [new_buffer(self.offsets, size)]
        self.take, self.give = self.free.pop, self.free.append

    def new(self) -> tuple:
        return new_buffer(self.offsets, self.size)


def read_fields(params: int, extra: int, offsets: list, sizes: list) -> list:
    """The bytes of each field as the driver reads them: through kernelParams' pointers, or
    at the offsets of the buffer in `extra` (whose size must cover every field). Tests and
    debugging use this to check what a launch hands over."""
    if params:
        pointers = (ctypes.c_void_p * len(sizes)).from_address(params)
        return [ctypes.string_at(pointers[i], n) for i, n in enumerate(sizes)]
    if not extra:
        return [] if not sizes else _missing(sizes)
    fields, at = {}, extra
    while True:           # key, value pairs up to LAUNCH_PARAM_END (NULL)
        key = ctypes.c_void_p.from_address(at).value
        if not key:
            break
        fields[key] = ctypes.c_void_p.from_address(at + ctypes.sizeof(ctypes.c_void_p)).value
        at += 2 * ctypes.sizeof(ctypes.c_void_p)
    start = fields[LAUNCH_PARAM_BUFFER_POINTER]
    size = ctypes.c_size_t.from_address(fields[LAUNCH_PARAM_BUFFER_SIZE]).value
    if offsets and offsets[-1] + sizes[-1] > size:
        raise ValueError(f"parameter buffer of {size} bytes, the fields need "
                         f"{offsets[-1] + sizes[-1]}")
    return [ctypes.string_at(start + offset, n) for offset, n in zip(offsets, sizes)]


def _missing(sizes):
    raise ValueError(f"{len(sizes)} parameters but neither kernelParams nor extra given")
