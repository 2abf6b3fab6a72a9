"""How each kind of array argument yields its pointer, decided once per Python *type*.

Input: an argument's type (pk Array, numpy array, torch tensor, CuPy array, anything with
`__cuda_array_interface__` or `__dlpack__`), and per pointer parameter the element types it
accepts (dtype names: "float32", "bfloat16", ...), the device kind and ordinal.
Output: `source_of(cls)` -> a PointerSource with
- `fast(accepted, kind, ordinal)`: a function `value -> address`, or None when the value does
  not qualify (wrong dtype, device, layout): then the packer asks `view` and explains;
- `view(value)` -> PointerView (address, bytes, dtype name, contiguity, device): the slow path,
  for error messages and the CPU target's bounds.

The fast functions use what each library exposes cheaply (torch: `dtype` objects and
`data_ptr()`; CuPy: `data.ptr`) and compare dtypes as objects of that library, so no numpy
dtype is built per launch; a `__cuda_array_interface__` dict is still built per call by its
producer, but its typestr is looked up in a table, not parsed.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from . import dlpack
from .arrays import Array

_DLPACK_KINDS = {dlpack.KDL_CUDA: "cuda", dlpack.KDL_CUDA_MANAGED: "cuda",
                 dlpack.KDL_CPU: "cpu"}


@dataclass(frozen=True)
class PointerView:
    """Everything the packer checks about one array argument (the slow path)."""
    address: int
    nbytes: int
    dtype: str             # numpy dtype name, or "bfloat16"
    contiguous: bool
    device: str            # "cuda", "cpu", or what the producer calls its device
    ordinal: int | None    # the producer's device number (None: not known)
    hint: str = ""         # why the producer's own protocol failed, if it did


@dataclass(frozen=True, eq=False)
class PointerSource:
    name: str
    view: object           # value -> PointerView
    fast: object           # (accepted names, kind, ordinal) -> (value -> address | None)


def _no_fast(accepted, kind, ordinal):
    return None


# --- pk Array ---------------------------------------------------------------------------------
def _array_view(value: Array) -> PointerView:
    return PointerView(value._ptr, value.nbytes, value._dtype.name, True, value._device_kind,
                       getattr(value._device, "ordinal", None))


def _array_fast(accepted, kind, ordinal):
    dtypes = {np.dtype(n) for n in accepted if n != "bfloat16"}

    def fast(value):
        if value._device_kind == kind and value._dtype in dtypes and (
                ordinal is None or getattr(value._device, "ordinal", None) in (None, ordinal)):
            return value._ptr
        return None
    return fast


# --- numpy (host memory: the CPU target only) -------------------------------------------------
def _numpy_view(value: np.ndarray) -> PointerView:
    return PointerView(value.ctypes.data, value.nbytes, value.dtype.name,
                       value.flags.c_contiguous, "cpu", None)


def _numpy_fast(accepted, kind, ordinal):
    if kind != "cpu":
        return None
    dtypes = {np.dtype(n) for n in accepted if n != "bfloat16"}

    def fast(value):
        if value.dtype in dtypes and value.flags.c_contiguous:
            return value.ctypes.data
        return None
    return fast


# --- torch ------------------------------------------------------------------------------------
def _torch_dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")      # torch.float32 -> "float32"


def _torch_view(value) -> PointerView:
    device = value.device
    kind = {"cuda": "cuda", "cpu": "cpu"}.get(device.type, device.type)
    return PointerView(value.data_ptr(), value.numel() * value.element_size(),
                       _torch_dtype_name(value.dtype), value.is_contiguous(), kind,
                       device.index if kind == "cuda" else None)


def _torch_fast(accepted, kind, ordinal):
    torch = sys.modules["torch"]
    dtypes = {d for d in vars(torch).values()
              if isinstance(d, torch.dtype) and _torch_dtype_name(d) in accepted}
    if kind == "cpu":
        devices = (-1,)                       # get_device(): -1 for host tensors
    elif kind == "cuda":
        devices = (ordinal,) if ordinal is not None else None
    else:
        return None

    def fast(value):
        if value.dtype in dtypes and value.is_contiguous():
            device = value.get_device()
            if device in devices if devices is not None else device >= 0:
                return value.data_ptr()
        return None
    return fast


# --- CuPy -------------------------------------------------------------------------------------
def _cupy_view(value) -> PointerView:
    return PointerView(value.data.ptr, value.nbytes, value.dtype.name,
                       value.flags.c_contiguous, "cuda", value.device.id)


def _cupy_fast(accepted, kind, ordinal):
    if kind != "cuda":
        return None
    dtypes = {np.dtype(n) for n in accepted if n != "bfloat16"}

    def fast(value):
        if value.dtype in dtypes and value.flags.c_contiguous and (
                ordinal is None or value.device.id == ordinal):
            return value.data.ptr
        return None
    return fast


# --- __cuda_array_interface__ (Numba, JAX, ...) -----------------------------------------------
_TYPESTRS: dict = {}     # typestr -> (dtype name, itemsize), filled as typestrs are met


def _typestr(typestr: str) -> tuple:
    known = _TYPESTRS.get(typestr)
    if known is None:
        dtype = np.dtype(typestr)
        known = _TYPESTRS[typestr] = (dtype.name if dtype.isnative else typestr, dtype.itemsize)
    return known


def _contiguous(shape, strides, itemsize) -> bool:
    if strides is None:
        return True
    expected = itemsize
    for extent, stride in zip(reversed(shape), reversed(strides)):
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True


def _cai_view(value) -> PointerView:
    interface = value.__cuda_array_interface__
    shape = tuple(interface["shape"])
    name, itemsize = _typestr(interface["typestr"])
    nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
    return PointerView(int(interface["data"][0]), nbytes, name,
                       _contiguous(shape, interface.get("strides"), itemsize), "cuda", None)


def _cai_fast(accepted, kind, ordinal):
    if kind != "cuda":
        return None

    def fast(value):
        interface = value.__cuda_array_interface__
        name, itemsize = _typestr(interface["typestr"])
        if name in accepted and _contiguous(interface["shape"], interface.get("strides"),
                                            itemsize):
            return interface["data"][0]
        return None
    return fast


# --- DLPack -----------------------------------------------------------------------------------
def _dlpack_view(value) -> PointerView:
    try:
        view = dlpack.read_dlpack(value)
    except (TypeError, BufferError, RuntimeError) as exc:
        return PointerView(0, 0, "", False, "unknown", None, f"its __dlpack__ failed: {exc}")
    device = _DLPACK_KINDS.get(view.device_type, f"DLPack device type {view.device_type}")
    hint = "" if view.device_type in _DLPACK_KINDS else \
        f"its DLPack device type is {view.device_type}"
    dtype = view.dtype if isinstance(view.dtype, str) else view.dtype.name
    return PointerView(view.ptr, view.nbytes, dtype, view.is_c_contiguous(), device,
                       view.device_id, hint)


def _dlpack_fast(accepted, kind, ordinal):
    def fast(value):
        view = _dlpack_view(value)
        if view.device == kind and view.dtype in accepted and view.contiguous and (
                ordinal is None or kind != "cuda" or view.ordinal == ordinal):
            return view.address
        return None
    return fast


# --- a type that does not say: each value is asked (instance attributes) ----------------------
def _probed(value) -> PointerSource:
    if hasattr(value, "__cuda_array_interface__"):
        return CUDA_ARRAY_INTERFACE
    return DLPACK if hasattr(value, "__dlpack__") else NOT_AN_ARRAY


def _probe_view(value):
    return _probed(value).view(value)


def _probe_fast(accepted, kind, ordinal):
    by_source = {}

    def fast(value):
        source = _probed(value)
        if source not in by_source:
            by_source[source] = source.fast(accepted, kind, ordinal)
        found = by_source[source]
        return found(value) if found is not None else None
    return fast


ARRAY = PointerSource("pykernel Array", _array_view, _array_fast)
NUMPY = PointerSource("numpy", _numpy_view, _numpy_fast)
TORCH = PointerSource("torch", _torch_view, _torch_fast)
CUPY = PointerSource("cupy", _cupy_view, _cupy_fast)
CUDA_ARRAY_INTERFACE = PointerSource("__cuda_array_interface__", _cai_view, _cai_fast)
DLPACK = PointerSource("DLPack", _dlpack_view, _dlpack_fast)
NOT_AN_ARRAY = PointerSource("not an array", lambda value: None, _no_fast)
PROBED = PointerSource("asked per value", _probe_view, _probe_fast)

_BY_TYPE: dict = {}


def source_of(cls) -> PointerSource:
    """The PointerSource for arguments of type `cls` (decided once per type)."""
    source = _BY_TYPE.get(cls)
    if source is None:
        source = _BY_TYPE[cls] = _classify(cls)
    return source


def _is_subclass(cls, module: str, name: str) -> bool:
    base = getattr(sys.modules.get(module), name, None)   # never imports the library
    return isinstance(base, type) and issubclass(cls, base)


def _classify(cls) -> PointerSource:
    if issubclass(cls, Array):
        return ARRAY
    if issubclass(cls, np.ndarray):
        return NUMPY
    if _is_subclass(cls, "torch", "Tensor"):
        return TORCH
    if _is_subclass(cls, "cupy", "ndarray"):
        return CUPY
    if hasattr(cls, "__cuda_array_interface__"):
        return CUDA_ARRAY_INTERFACE
    if hasattr(cls, "__dlpack__"):
        return DLPACK
    if cls in (int, float, bool, str, type(None), list, tuple, dict):
        return NOT_AN_ARRAY
    return PROBED
