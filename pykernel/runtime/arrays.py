"""Arrays on a device: one class for both devices, backed by a device allocation (cuda) or an
aligned numpy byte buffer (cpu). Views (basic indexing, reshape, dtype view) share the
allocation and only move the pointer, so a KV cache or a weight pool can be one allocation.

Input: shapes/dtypes/numpy data and a Device (`current_device()` by default).
Output: `Array` with .ptr (int address), .shape, .dtype, .numpy() (a host copy), interop
protocols (`__cuda_array_interface__` v3 on cuda, `__dlpack__` on both, `__array__` on cpu).

A device supplies its memory operations through `device.memory` (see `HostMemory` for the
interface); a device without one and `kind == "cpu"` uses `HostMemory`.
"""
from __future__ import annotations

import ctypes
import math
import operator

import numpy as np

from . import dlpack
from .device import current_device

_HOST_ALIGN = 64  # cache line: lets the CPU target use aligned vector loads


class HostMemory:
    """Memory operations on host memory (the cpu device). Every device's `memory` has these."""
    kind = "cpu"

    def alloc(self, nbytes: int):
        """-> (owner keeping the memory alive, aligned address)."""
        raw = np.empty(nbytes + _HOST_ALIGN, dtype=np.uint8)
        start = (-raw.ctypes.data) % _HOST_ALIGN
        return raw, raw.ctypes.data + start

    def upload(self, dst: int, host: np.ndarray) -> None:
        ctypes.memmove(dst, host.ctypes.data, host.nbytes)

    def download(self, host: np.ndarray, src: int) -> None:
        ctypes.memmove(host.ctypes.data, src, host.nbytes)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        ctypes.memmove(dst, src, nbytes)

    def memset(self, dst: int, byte: int, nbytes: int) -> None:
        ctypes.memset(dst, byte, nbytes)

    def alloc_pinned(self, nbytes: int):
        return self.alloc(nbytes)

    def download_async(self, host: np.ndarray, src: int, stream) -> None:
        self.download(host, src)

    def upload_async(self, dst: int, host: np.ndarray, stream) -> None:
        self.upload(dst, host)


HOST_MEMORY = HostMemory()


class _HostBuffer:
    """Owner of page-locked (or plain) host memory, exposed to numpy as a byte array."""

    def __init__(self, owner, address: int, nbytes: int):
        self._owner = owner
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                    "data": (address, False), "version": 3}


def pinned_empty(shape, dtype, device=None) -> np.ndarray:
    """A host numpy array in page-locked memory on cuda (device-to-host copies into it can run
    asynchronously: `Array.copy_to_host_async`), a plain aligned one on the cpu device. The
    memory is freed when the array (and every view of it) is gone."""
    device = device or current_device()
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = max(1, math.prod(shape) * dtype.itemsize)
    owner, address = memory_of(device).alloc_pinned(nbytes)
    raw = np.asarray(_HostBuffer(owner, address, nbytes))
    return raw[:math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)


def memory_of(device):
    memory = getattr(device, "memory", None)
    if memory is not None:
        return memory
    if device.kind == "cpu":
        return HOST_MEMORY
    raise TypeError(f"device {device!r} has no memory operations")


def _shape_tuple(shape) -> tuple:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        shape = tuple(map(operator.index, shape))
    except TypeError:
        raise TypeError(f"shape must be an int or a tuple of ints, got {shape!r}") from None
    if shape and min(shape) < 0:
        raise ValueError(f"shape must not have negative extents, got {shape}")
    return shape


def _normalize_dtype(dtype):
    dtype = np.dtype(dtype)
    if dtype.hasobject or dtype.kind not in "biuf":
        raise TypeError(f"device arrays hold bool, integer or float elements, not {dtype}")
    return dtype if dtype.isnative else np.dtype(dtype.newbyteorder("=").str)


class Array:
    """A C-contiguous array in a device's memory (see the module docstring)."""
    __slots__ = ("_owner", "_ptr", "_shape", "_dtype", "_device", "_device_kind", "__weakref__")

    def __init__(self, owner, ptr: int, shape: tuple, dtype, device):
        self._owner = owner          # the allocation (freed when the last view dies)
        self._ptr = ptr
        self._shape = shape
        self._dtype = dtype
        self._device = device
        self._device_kind = device.kind

    # -- properties -------------------------------------------------------------------------
    shape = property(lambda self: self._shape)
    dtype = property(lambda self: self._dtype)
    device = property(lambda self: self._device)
    ptr = property(lambda self: self._ptr, doc="address of element 0 (int)")
    ndim = property(lambda self: len(self._shape))
    size = property(lambda self: math.prod(self._shape))

    def __class_getitem__(cls, item):
        """`pk.Array[f32, 2]` in a kernel signature: an n-d array parameter whose shape and
        strides travel with the pointer (docs/language.md, "N-d array parameters")."""
        from ..types import array_annotation
        return array_annotation(item)
    nbytes = property(lambda self: math.prod(self._shape) * self._dtype.itemsize)
    itemsize = property(lambda self: self._dtype.itemsize)

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d array")
        return self._shape[0]

    def __repr__(self) -> str:
        return (f"Array(shape={self._shape}, dtype={self._dtype}, "
                f"device={self._device_kind}, ptr=0x{self._ptr:x})")

    def _view(self, offset_bytes: int, shape: tuple, dtype=None) -> "Array":
        return Array(self._owner, self._ptr + offset_bytes, shape, dtype or self._dtype,
                     self._device)

    # -- host transfers ---------------------------------------------------------------------
    def numpy(self, out: np.ndarray | None = None) -> np.ndarray:
        """A host copy (waits for the device work ordered before it on the default stream),
        into `out` when given (same shape and dtype, C-contiguous; page-locked memory from
        `pinned_empty` takes the copy several times faster than pageable memory)."""
        if out is None:
            out = np.empty(self._shape, dtype=self._dtype)
        else:
            if not isinstance(out, np.ndarray):
                raise TypeError(f"numpy: out must be a numpy array, got {type(out).__name__}")
            self._check_same_layout(out.shape, out.dtype, "out array")
            if not out.flags.c_contiguous:
                raise ValueError("numpy: out array must be C-contiguous")
        if out.nbytes:
            memory_of(self._device).download(out, self._ptr)
        return out

    def copy_to_host_async(self, host: np.ndarray, stream=None) -> np.ndarray:
        """Copy into `host` (same shape and dtype; from `pinned_empty` for a truly
        asynchronous copy) in stream order on `stream` (None: the default stream); record an
        Event after it and synchronize that before reading `host`. On the cpu device the copy
        is immediate."""
        self._check_host_array(host, "copy_to_host_async")
        if self.nbytes:
            memory_of(self._device).download_async(host, self._ptr, stream)
        return host

    def copy_from_host_async(self, host: np.ndarray, stream=None) -> "Array":
        """Copy `host` (same shape and dtype, C-contiguous; from `pinned_empty` for a truly
        asynchronous copy) into this array in stream order on `stream` (None: the default
        stream): the host goes on at once, and kernels queued after the copy read the new
        values. `host` must stay unchanged until the copy has run (synchronize an Event
        recorded after it, or read something back that was queued after it). On the cpu
        device the copy is immediate."""
        self._check_host_array(host, "copy_from_host_async")
        if self.nbytes:
            memory_of(self._device).upload_async(self._ptr, host, stream)
        return self

    def _check_host_array(self, host, what: str) -> None:
        """An asynchronous copy's host side: a C-contiguous numpy array of this layout."""
        if not isinstance(host, np.ndarray):
            raise TypeError(f"{what}: host must be a numpy array, got {type(host).__name__}")
        self._check_same_layout(host.shape, host.dtype, "host array")
        if not host.flags.c_contiguous:
            raise ValueError(f"{what}: host array must be C-contiguous")

    def copy_from(self, source) -> "Array":
        """Copy a numpy array or an Array of the same shape and dtype into this array."""
        if isinstance(source, Array):
            self._check_same_layout(source.shape, source.dtype, "Array")
            if source.device is not self._device:
                raise ValueError(f"copy_from: source is on {source.device!r}, "
                                 f"destination on {self._device!r}; go through .numpy()")
            if self.nbytes:
                memory_of(self._device).copy(self._ptr, source.ptr, self.nbytes)
            return self
        host = np.asarray(source)
        self._check_same_layout(host.shape, host.dtype, "numpy array")
        if self.nbytes:
            memory_of(self._device).upload(self._ptr, np.ascontiguousarray(host))
        return self

    def _check_same_layout(self, shape, dtype, what):
        if tuple(shape) != self._shape or np.dtype(dtype) != self._dtype:
            raise ValueError(f"copy_from: destination is {self._shape} {self._dtype}, "
                             f"source {what} is {tuple(shape)} {np.dtype(dtype)} "
                             f"(convert explicitly, e.g. x.astype(np.{self._dtype}))")

    def fill(self, value) -> "Array":
        """Set every element to `value` (converted to this array's dtype)."""
        if self.nbytes:
            if value == 0:
                memory_of(self._device).memset(self._ptr, 0, self.nbytes)
            else:
                self.copy_from(np.full(self._shape, value, dtype=self._dtype))
        return self

    def __setitem__(self, index, value):
        target = self[index]
        if isinstance(value, (Array, np.ndarray)):
            target.copy_from(value)
        else:
            target.fill(value)

    # -- views ------------------------------------------------------------------------------
    def __getitem__(self, index) -> "Array":
        """Basic indexing that stays contiguous: ints, then at most one slice with step 1,
        then only full slices, e.g. a[3], a[2:5], a[1, 4:8], a[2, 1:3, :]."""
        index = index if isinstance(index, tuple) else (index,)
        if len(index) > len(self._shape):
            raise IndexError(f"too many indices ({len(index)}) for a {self.ndim}-d array")
        offset, shape, strides = 0, list(self._shape), _c_strides(self._shape)
        slice_seen = False  # after any slice only full slices keep the view contiguous
        for axis, item in enumerate(index):
            extent = self._shape[axis]
            if isinstance(item, slice):
                start, stop, step = item.indices(extent)
                if step != 1:
                    raise IndexError("device array views support step 1 only")
                if slice_seen and not (start == 0 and stop == extent):
                    raise IndexError("this index would give a non-contiguous view; "
                                     "copy through .numpy() instead")
                slice_seen = True
                shape[axis] = max(0, stop - start)
                offset += start * strides[axis]
            else:
                if slice_seen:
                    raise IndexError("an integer index after a slice gives a non-contiguous "
                                     "view; copy through .numpy() instead")
                position = operator.index(item)
                if not -extent <= position < extent:
                    raise IndexError(f"index {position} is out of bounds for axis {axis} "
                                     f"with size {extent}")
                offset += (position % extent) * strides[axis]
                shape[axis] = None
        shape = tuple(n for n in shape if n is not None)
        return self._view(offset * self._dtype.itemsize, shape)

    def reshape(self, *shape) -> "Array":
        """Same memory, new shape (one extent may be -1)."""
        if shape == (-1,):      # flattening: kernel wrappers do it on every launch
            return Array(self._owner, self._ptr, (math.prod(self._shape),), self._dtype,
                         self._device)
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        try:
            dims = tuple(map(operator.index, shape))
        except TypeError:
            raise TypeError(f"reshape: extents must be ints, got {shape!r}") from None
        if -1 in dims:
            if dims.count(-1) > 1:
                raise ValueError("reshape: only one extent may be -1")
            known = math.prod(n for n in dims if n != -1)
            if known == 0 or self.size % known:
                raise ValueError(f"reshape: cannot infer -1 for size {self.size} into {dims}")
            dims = tuple(self.size // known if n == -1 else n for n in dims)
        if (dims and min(dims) < 0) or math.prod(dims) != self.size:
            raise ValueError(f"reshape: cannot reshape size {self.size} into {dims}")
        return self._view(0, dims)

    def view_as(self, shape: tuple, dtype) -> "Array":
        """The first prod(shape) elements of `dtype` at this array's address (a buffer reused
        for other shapes, e.g. an activation arena). shape: a tuple of non-negative ints."""
        dtype = _normalize_dtype(dtype)
        if math.prod(shape) * dtype.itemsize > self.nbytes:
            raise ValueError(f"view_as: {shape} {dtype} needs more than the {self.nbytes} bytes "
                             f"of this array")
        if self._ptr % dtype.itemsize:
            raise ValueError(f"view_as: address is not aligned to {dtype.itemsize} bytes")
        return self._view(0, _shape_tuple(shape), dtype)

    def view(self, dtype) -> "Array":
        """Reinterpret the bytes as `dtype`; the last extent scales with the itemsize."""
        dtype = _normalize_dtype(dtype)
        if dtype.itemsize == self._dtype.itemsize:
            return self._view(0, self._shape, dtype)
        if not self._shape:
            raise ValueError("view: a 0-d array cannot change its itemsize")
        last_bytes = self._shape[-1] * self._dtype.itemsize
        if last_bytes % dtype.itemsize:
            raise ValueError(f"view: last extent of {last_bytes} bytes is not a multiple of "
                             f"{dtype} ({dtype.itemsize} bytes)")
        if self._ptr % dtype.itemsize:
            raise ValueError(f"view: address is not aligned to {dtype.itemsize} bytes")
        return self._view(0, self._shape[:-1] + (last_bytes // dtype.itemsize,), dtype)

    # -- interop ----------------------------------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict:
        if self._device_kind != "cuda":
            raise AttributeError("__cuda_array_interface__ exists on cuda arrays only")
        return {"shape": self._shape, "typestr": self._dtype.str, "data": (self._ptr, False),
                "strides": None, "version": 3, "stream": None}

    def __dlpack_device__(self) -> tuple[int, int]:
        if self._device_kind == "cuda":
            return dlpack.KDL_CUDA, getattr(self._device, "ordinal", 0)
        return dlpack.KDL_CPU, 0

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule: versioned (writable) when the consumer passes max_version >= 1,
        else legacy. Work on pykernel's blocking streams is ordered before the consumer's
        legacy-default-stream work, so `stream` needs nothing."""
        if copy:
            raise BufferError("__dlpack__(copy=True) is not supported; use .numpy()")
        device_type, device_id = self.__dlpack_device__()
        if dl_device is not None and tuple(dl_device) != (device_type, device_id):
            raise BufferError(f"__dlpack__: array lives on {(device_type, device_id)}, "
                              f"consumer asked for {tuple(dl_device)}")
        versioned = max_version is not None and tuple(max_version) >= (1, 0)
        return dlpack.export_capsule(self._ptr, self._shape, self._dtype, device_type,
                                     device_id, self, versioned)

    def __array__(self, dtype=None, copy=None):
        if self._device_kind != "cpu":
            raise TypeError("implicit conversion of a device array to numpy is not allowed; "
                            "use .numpy() for a host copy")
        host = np.ctypeslib.as_array((ctypes.c_uint8 * self.nbytes).from_address(self._ptr)) \
            if self.nbytes else np.empty(0, np.uint8)
        view = host.view(self._dtype).reshape(self._shape)
        view = view if dtype is None else view.astype(dtype, copy=bool(copy))
        return view.copy() if copy else view


def _c_strides(shape: tuple) -> list:
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return strides[::-1]


def empty(shape, dtype=np.float32, device=None) -> Array:
    """Uninitialized array on `device` (default: the current device)."""
    device = device or current_device()
    shape, dtype = _shape_tuple(shape), _normalize_dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    owner, ptr = memory_of(device).alloc(nbytes) if nbytes else (None, 0)
    return Array(owner, ptr, shape, dtype, device)


def zeros(shape, dtype=np.float32, device=None) -> Array:
    return empty(shape, dtype, device).fill(0)


def full(shape, value, dtype=np.float32, device=None) -> Array:
    return empty(shape, dtype, device).fill(value)


def to_device(host, dtype=None, device=None) -> Array:
    """Copy a numpy array (or anything np.asarray takes) to a new device array. On the cpu
    device this is still a copy, so later writes to `host` never alias the kernel's input."""
    host = np.ascontiguousarray(np.asarray(host, dtype=dtype))
    if not host.dtype.isnative:
        host = host.astype(host.dtype.newbyteorder("="))
    out = empty(host.shape, host.dtype, device)
    if host.nbytes:
        memory_of(out.device).upload(out.ptr, host)
    return out
