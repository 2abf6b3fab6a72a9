"""Launch arguments of n-d array parameters (`pk.Array[f32, 2]`).

Input: an ArgPacker whose ABI has "array" parameters (the data pointer, then `rank` i64
extents, then `rank` i64 strides in elements: compiler.param_abi); per launch, the caller's
runtime arguments, one per kernel parameter. Output: `install` wraps the packer's `pack` so
that each array argument (a pk Array; a numpy array on the CPU device; on CUDA anything with
`__cuda_array_interface__`; anything with `__dlpack__`) becomes its address, shape and
strides, and the rest of the ABI packs as before; `pointer_extents` gives each view's memory
span (the CPU target checks every access against it). Views need not be contiguous: the
strides come from the array (numpy's and CAI's byte strides must be whole elements)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import LaunchError
from . import dlpack
from .arrays import Array

_DSL = {"int8": "i8", "uint8": "u8", "int16": "i16", "uint16": "u16", "int32": "i32",
        "uint32": "u32", "int64": "i64", "uint64": "u64", "float16": "f16", "float32": "f32",
        "float64": "f64", "bool": "bool_", "bfloat16": "bf16"}
_DEVICE_TYPES = {"cuda": (dlpack.KDL_CUDA, dlpack.KDL_CUDA_MANAGED), "cpu": (dlpack.KDL_CPU,)}


@dataclass(frozen=True)
class ArrayView:
    """What a kernel receives for one array argument."""
    ptr: int
    shape: tuple
    strides: tuple       # in elements
    itemsize: int

    def span(self) -> tuple[int, int]:
        """(lowest address, bytes) of the memory the view can reach (negative strides too)."""
        if 0 in self.shape:
            return self.ptr, 0
        low = sum(min(0, (n - 1) * s) for n, s in zip(self.shape, self.strides))
        high = sum(max(0, (n - 1) * s) for n, s in zip(self.shape, self.strides))
        return self.ptr + low * self.itemsize, (high - low + 1) * self.itemsize


def install(packer) -> None:
    """Make `packer.pack(args)` / `packer.pointer_extents(args)` take one argument per kernel
    parameter and fill the expanded array fields (no-op for kernels without arrays)."""
    if not any(p.kind == "array" for p in packer.params):
        return
    user = caller_params(packer.params)
    inner_pack, inner_extents = packer.pack, packer.pointer_extents

    def expand(args):
        try:
            given = len(args)
        except TypeError:
            raise LaunchError(f"{packer.kernel_name}(): arguments must be a tuple, got "
                              f"{type(args).__name__}") from None
        if given != len(user):
            names = ", ".join(p.name for _, p in user)
            raise LaunchError(f"{packer.kernel_name}(): expects {len(user)} runtime arguments "
                              f"({names}), got {given}")
        flat, views = [], {}
        for (index, param), value in zip(user, args):
            if param.kind != "array":
                flat.append(value)
                continue
            view = array_view(packer, param, value)
            flat += [view.ptr, *view.shape, *view.strides]
            views[index] = view
        return flat, views

    def pack(args):
        return inner_pack(expand(args)[0])

    def pointer_extents(args):
        flat, views = expand(args)
        extents = inner_extents(flat)
        for index, view in views.items():
            extents[index] = view.span()
        return extents

    packer.pack, packer.pointer_extents = pack, pointer_extents


def caller_params(abi) -> list:
    """(ABI index, ParamABI) of each parameter a caller passes: the ABI without the extents
    and strides that follow each array parameter."""
    user, k = [], 0
    while k < len(abi):
        user.append((k, abi[k]))
        k += 1 + 2 * getattr(abi[k], "rank", 0) if abi[k].kind == "array" else 1
    return user


def _dtype_name(dtype) -> str:
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name


def array_view(packer, param, value) -> ArrayView:
    """The view of `value` that array parameter `param` receives, else a LaunchError naming
    kernel, parameter, the expected rank and dtype and what was given."""
    kind = packer.device_kind
    if isinstance(value, Array):
        if value.device.kind != kind:
            raise _error(packer, param, value, f"the kernel runs on {kind}: move the data with "
                         "pk.to_device(x.numpy())")
        ordinal = getattr(value.device, "ordinal", None)
        if packer.device_ordinal is not None and ordinal not in (None, packer.device_ordinal):
            raise _error(packer, param, value, f"this array is on {kind}:{ordinal}, the "
                         f"launch on {kind}:{packer.device_ordinal}")
        shape = tuple(value.shape)
        view = (value.ptr, shape, _c_strides(shape), value.dtype)
    elif isinstance(value, np.ndarray):
        if kind != "cpu":
            raise _error(packer, param, value, "host memory: copy it first with "
                         "pk.to_device(x)")
        view = (value.ctypes.data, value.shape, _element_strides(packer, param, value,
                value.strides, value.dtype), value.dtype)
    elif kind == "cuda" and hasattr(value, "__cuda_array_interface__"):
        view = _cai_view(packer, param, value)
    elif hasattr(value, "__dlpack__"):
        view = _dlpack_view(packer, param, value)
    else:
        raise _error(packer, param, value)
    ptr, shape, strides, dtype = view
    _check_rank_dtype(packer, param, value, shape, dtype)
    itemsize = 2 if isinstance(dtype, str) else np.dtype(dtype).itemsize
    return ArrayView(int(ptr), tuple(int(n) for n in shape), tuple(strides), itemsize)


def _check_rank_dtype(packer, param, value, shape, dtype):
    if len(shape) != param.rank:
        raise _error(packer, param, value, f"it has {len(shape)} dimensions, the parameter "
                     f"{param.rank}")
    expected = _dtype_name(param.dtype)
    given = _dtype_name(dtype)
    if given != expected and not (expected == "bfloat16" and given == "uint16"):
        raise _error(packer, param, value, f"element type is {given}, the parameter's "
                     f"{_DSL.get(expected, expected)}")


def _cai_view(packer, param, value):
    interface = value.__cuda_array_interface__
    shape = tuple(interface["shape"])
    dtype = np.dtype(interface["typestr"])
    strides = interface.get("strides")
    strides = _c_strides(shape) if strides is None else \
        _element_strides(packer, param, value, strides, dtype)
    return int(interface["data"][0]), shape, strides, dtype


def _dlpack_view(packer, param, value):
    try:
        view = dlpack.read_dlpack(value)
    except (TypeError, BufferError, RuntimeError) as exc:
        raise _error(packer, param, value, f"its __dlpack__ failed: {exc}") from None
    if view.device_type not in _DEVICE_TYPES[packer.device_kind]:
        raise _error(packer, param, value, f"its DLPack device type is {view.device_type}")
    strides = _c_strides(view.shape) if view.strides is None else tuple(view.strides)
    return view.ptr, view.shape, strides, view.dtype


def _element_strides(packer, param, value, byte_strides, dtype) -> tuple:
    itemsize = np.dtype(dtype).itemsize
    if any(s % itemsize for s in byte_strides):
        raise _error(packer, param, value, f"its byte strides {tuple(byte_strides)} are not "
                     f"whole elements of {itemsize} bytes")
    return tuple(int(s) // itemsize for s in byte_strides)


def _c_strides(shape) -> tuple:
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= int(extent)
    return tuple(strides[::-1])


def _describe(value) -> str:
    """'a 3-d numpy.ndarray of float64 with shape (2, 3, 4)', or the type for non-arrays."""
    name = (type(value).__module__ + "." + type(value).__qualname__).removeprefix("builtins.")
    if isinstance(value, Array):
        name = f"pykernel Array on {value.device.kind}"
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return f"{name} {value!r}" if isinstance(value, (int, float, bool, str)) else name
    return f"a {len(tuple(shape))}-d {name} of {dtype} with shape {tuple(shape)}"


def _error(packer, param, value, hint: str = "") -> LaunchError:
    elem = _DSL.get(_dtype_name(param.dtype), _dtype_name(param.dtype))
    expected = (f"a {param.rank}-d {packer.device_kind} array of {elem} "
                f"({param.type_name or f'Array[{elem}, {param.rank}]'})")
    message = (f"{packer.kernel_name}(): parameter '{param.name}' expects {expected}, got "
               f"{_describe(value)}")
    return LaunchError(message + (f"; {hint}" if hint else ""))
