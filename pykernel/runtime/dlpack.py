"""DLPack without a C extension: export a pointer+shape+dtype as a "dltensor" capsule, and read
the pointer, shape, strides, dtype and device out of any object's `__dlpack__` capsule.

Input: raw pointers and numpy dtypes (export); an object with `__dlpack__` (import).
Output: a PyCapsule that numpy/torch/cupy consume (export); a `DLPackView` (import).
The capsule name is a C string that must outlive the capsule: module-level bytes constants.

Layouts (dlpack.h, ABI-stable since v0.6):
    DLDevice  { int32 device_type; int32 device_id }
    DLDataType{ uint8 code; uint8 bits; uint16 lanes }
    DLTensor  { void* data; DLDevice device; int32 ndim; DLDataType dtype; int64* shape;
                int64* strides; uint64 byte_offset }
    DLManagedTensor          { DLTensor dl_tensor; void* manager_ctx; void (*deleter)(self*) }
    DLManagedTensorVersioned { uint32 major, minor; void* manager_ctx; void (*deleter)(self*);
                               uint64 flags; DLTensor dl_tensor }
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13
_INT, _UINT, _FLOAT, _BFLOAT, _BOOL = 0, 1, 2, 4, 6
_CODE_OF_KIND = {"i": _INT, "u": _UINT, "f": _FLOAT, "b": _BOOL}
_KIND_OF_CODE = {_INT: "i", _UINT: "u", _FLOAT: "f", _BOOL: "b"}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _Deleter)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


# Our own prototypes (never mutate ctypes.pythonapi's shared function objects).
_api = ctypes.pythonapi
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                                 ctypes.c_void_p)(("PyCapsule_New", _api))
_capsule_get = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))
_capsule_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", _api))
# The destructor runs while the capsule's refcount is 0: only raw pointers there.
_capsule_valid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", _api))
_capsule_get_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))

_LEGACY_NAME, _VERSIONED_NAME = b"dltensor", b"dltensor_versioned"
# address of an exported DLManagedTensor -> (struct, shape array, owner): keeps all alive
# until the consumer calls the deleter (or the capsule dies unconsumed).
_LIVE: dict[int, tuple] = {}


def _release(managed_address):
    _LIVE.pop(managed_address, None)


_DELETER = _Deleter(_release)


def _destroy_capsule(capsule_address):
    for name in (b"dltensor", b"dltensor_versioned"):  # still this name: never consumed
        if _capsule_valid_raw(capsule_address, name):
            _release(_capsule_get_raw(capsule_address, name))


_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_destroy_capsule)


def dtype_to_dl(dtype) -> tuple[int, int]:
    """numpy dtype (or "bfloat16") -> (DLDataType code, bits)."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        return _BFLOAT, 16
    dtype = np.dtype(dtype)
    if dtype.kind not in _CODE_OF_KIND:
        raise TypeError(f"DLPack export does not support dtype {dtype}")
    return _CODE_OF_KIND[dtype.kind], dtype.itemsize * 8


def dtype_from_dl(code: int, bits: int, lanes: int):
    """DLDataType -> numpy dtype, or the string "bfloat16"."""
    if lanes != 1:
        raise TypeError(f"DLPack tensors with {lanes} lanes are not supported")
    if code == _BFLOAT and bits == 16:
        return "bfloat16"
    if code not in _KIND_OF_CODE:
        raise TypeError(f"DLPack dtype code {code} ({bits} bits) is not supported")
    if code == _BOOL:
        return np.dtype(np.bool_)
    return np.dtype(f"{_KIND_OF_CODE[code]}{bits // 8}")


def export_capsule(ptr: int, shape: tuple, dtype, device_type: int, device_id: int,
                   owner, versioned: bool = False) -> object:
    """A DLPack capsule over C-contiguous, writable memory at `ptr`; `owner` stays alive until
    the consumer releases the tensor. `versioned` gives a DLPack 1.0 "dltensor_versioned"
    capsule (consumers treat legacy capsules as read-only)."""
    ndim = len(shape)
    shape_array = (ctypes.c_int64 * max(ndim, 1))(*shape)
    managed = _DLManagedTensorVersioned() if versioned else _DLManagedTensor()
    if versioned:
        managed.major, managed.minor, managed.flags = 1, 0, 0
    tensor = managed.dl_tensor
    tensor.data = ptr or None
    tensor.device = _DLDevice(device_type, device_id)
    tensor.ndim = ndim
    code, bits = dtype_to_dl(dtype)
    tensor.dtype = _DLDataType(code, bits, 1)
    tensor.shape = ctypes.cast(shape_array, ctypes.POINTER(ctypes.c_int64))
    tensor.strides = None  # NULL = C-contiguous
    tensor.byte_offset = 0
    managed.deleter = _DELETER
    address = ctypes.addressof(managed)
    _LIVE[address] = (managed, shape_array, owner)
    name = _VERSIONED_NAME if versioned else _LEGACY_NAME
    return _capsule_new(address, name, ctypes.cast(_CAPSULE_DESTRUCTOR, ctypes.c_void_p))


@dataclass(frozen=True)
class DLPackView:
    """What a `__dlpack__` capsule describes (the memory belongs to the producer)."""
    ptr: int
    shape: tuple
    strides: tuple | None  # in elements; None = C-contiguous
    dtype: object          # numpy dtype or "bfloat16"
    device_type: int
    device_id: int

    @property
    def itemsize(self) -> int:
        return 2 if isinstance(self.dtype, str) else self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.itemsize

    def is_c_contiguous(self) -> bool:
        if self.strides is None:
            return True
        expected = 1
        for extent, stride in zip(reversed(self.shape), reversed(self.strides)):
            if extent != 1 and stride != expected:
                return False
            expected *= extent
        return True


def _tensor_of(capsule) -> _DLTensor:
    if _capsule_valid(capsule, b"dltensor_versioned"):
        address = _capsule_get(capsule, b"dltensor_versioned")
        return _DLManagedTensorVersioned.from_address(address).dl_tensor
    if _capsule_valid(capsule, b"dltensor"):
        return _DLManagedTensor.from_address(_capsule_get(capsule, b"dltensor")).dl_tensor
    raise TypeError("__dlpack__ did not return a DLPack capsule")


def read_dlpack(obj) -> DLPackView:
    """Describe `obj.__dlpack__()` without taking ownership: the capsule's own destructor
    releases the producer's tensor, while `obj` keeps the memory alive."""
    capsule = obj.__dlpack__()
    tensor = _tensor_of(capsule)
    ndim = tensor.ndim
    shape = tuple(tensor.shape[i] for i in range(ndim))
    strides = tuple(tensor.strides[i] for i in range(ndim)) if tensor.strides else None
    dtype = dtype_from_dl(tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes)
    ptr = (tensor.data or 0) + tensor.byte_offset
    return DLPackView(ptr, shape, strides, dtype, tensor.device.device_type,
                      tensor.device.device_id)
