"""Argument checking and packing, built once per compiled kernel and shared by both devices.

Input: a CompiledKernel (duck-typed: .name, .params = [ParamABI(name, kind, dtype, size, align,
readonly)]) and the device kind; per launch, the runtime arguments in parameter order.
Output: `pack(args)` writes every argument into one preallocated buffer laid out per the ABI
(each parameter at its alignment) and returns the buffer's address; `params_address` is a
prebuilt `void*[]` pointing at each field (CUDA's kernelParams) and `extra_address` the
equivalent `extra` array handing the driver the whole buffer.

Fast path: a `pack` function generated per signature (like Triton's binder): inline checks
for our arrays, then one `struct.Struct.pack_into` writing all fields (cheaper than comparing
fields to skip unchanged ones). Anything else goes through the converters, and any failure
re-checks argument by argument to raise a LaunchError naming kernel, parameter, expected and
given.
"""
from __future__ import annotations

import ctypes
import struct

import numpy as np

from ..errors import LaunchError
from . import array_args, dlpack
from .arrays import Array

_FORMAT = {"int8": "b", "uint8": "B", "int16": "h", "uint16": "H", "int32": "i",
           "uint32": "I", "int64": "q", "uint64": "Q", "float16": "e", "float32": "f",
           "float64": "d", "bool": "B", "bfloat16": "H"}
_DSL_NAME = {"int8": "i8", "uint8": "u8", "int16": "i16", "uint16": "u16", "int32": "i32",
             "uint32": "u32", "int64": "i64", "uint64": "u64", "float16": "f16",
             "float32": "f32", "float64": "f64", "bool": "bool_", "bfloat16": "bf16"}
_DEVICE_TYPES = {"cuda": (dlpack.KDL_CUDA, dlpack.KDL_CUDA_MANAGED), "cpu": (dlpack.KDL_CPU,)}
_BUFFER_ALIGN = 16


def dtype_name(dtype) -> str:
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name


def type_label(param) -> str:
    if getattr(param, "type_name", None):  # the compiler's spelling, e.g. 'Ptr[f32, "ro"]'
        return param.type_name
    dsl = _DSL_NAME.get(dtype_name(param.dtype), dtype_name(param.dtype))
    return f"Ptr[{dsl}]" if param.kind == "ptr" else dsl


def f32_to_bf16_bits(value: float) -> int:
    """Round an f32 to bf16 (round to nearest, ties to even; NaN stays a quiet NaN)."""
    bits = struct.unpack("=I", struct.pack("=f", value))[0]
    if (bits & 0x7F800000) == 0x7F800000 and bits & 0x007FFFFF:
        return (bits >> 16) | 0x0040
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def _describe(value) -> str:
    if isinstance(value, Array):
        return f"Array of {value.dtype} on {value.device.kind}"
    if isinstance(value, np.ndarray):
        return f"numpy.ndarray of {value.dtype}"
    if isinstance(value, np.generic):
        return f"numpy.{type(value).__name__} {value!r}"
    name = type(value).__module__ + "." + type(value).__qualname__
    name = name.removeprefix("builtins.")
    return f"{name} {value!r}" if isinstance(value, (int, float, bool, str)) else name


class ArgPacker:
    """See the module docstring. One instance per (compiled kernel, device)."""

    def __init__(self, compiled, device_kind: str, device_ordinal: int | None = None):
        self.kernel_name = compiled.name
        self.params = list(compiled.params)
        self.device_kind = device_kind
        self.device_ordinal = device_ordinal
        fields, offsets, offset = ["="], [], 0
        for param in self.params:
            fmt = "Q" if param.kind in ("ptr", "array") else _scalar_format(param)
            pad = (-offset) % param.align
            fields.append(f"{pad}x{fmt}" if pad else fmt)
            offset += pad
            offsets.append(offset)
            offset += param.size
        self._struct = struct.Struct("".join(fields))
        self.size = self._struct.size
        self.offsets = offsets
        # pack_into's offset keeps the fields aligned whatever address ctypes hands out
        self._storage = (ctypes.c_uint8 * (self.size + _BUFFER_ALIGN))()
        self._base = (-ctypes.addressof(self._storage)) % _BUFFER_ALIGN
        self.address = ctypes.addressof(self._storage) + self._base
        self._pointers = (ctypes.c_void_p * max(1, len(offsets)))(
            *[self.address + o for o in offsets])
        self.params_address = ctypes.addressof(self._pointers) if offsets else 0
        # cuLaunchKernel's `extra` alternative: {BUFFER_POINTER, address, BUFFER_SIZE, &size, END}
        self._size_field = ctypes.c_size_t(self.size)
        self._extra = (ctypes.c_void_p * 5)(1, self.address, 2,
                                            ctypes.addressof(self._size_field), 0)
        self.extra_address = ctypes.addressof(self._extra)
        self._count = len(self.params)
        self.pack = _generate_pack(self)
        array_args.install(self)   # pk.Array parameters: expand each argument into its fields

    def pack(self, args) -> int:  # replaced per instance by the generated function
        """Check and write `args`; returns the buffer address (CPU entry point's argument)."""
        raise NotImplementedError

    def unpack(self) -> tuple:
        """The raw field values last packed (pointers as ints, bf16 as bits): for tests."""
        return self._struct.unpack_from(self._storage, self._base)

    def pointer_extents(self, args) -> list:
        """[(address, nbytes) for each pointer parameter, None for scalars]: the CPU target's
        bounds checks use these."""
        return [_resolve_pointer(self, p, a) if p.kind == "ptr" else None
                for p, a in zip(self.params, args)]

    def error(self, param, expected: str, value, hint: str = "") -> LaunchError:
        message = (f"{self.kernel_name}(): parameter '{param.name}' expects {expected}, "
                   f"got {_describe(value)}")
        return LaunchError(message + (f"; {hint}" if hint else ""))

    def expected(self, param) -> str:
        """What a scalar parameter takes, in words: 'an integer (i32)', 'a float (f32)'."""
        kind = "a float" if np.dtype(param.dtype).kind == "f" else "an integer"
        return f"{kind} ({type_label(param)})"

    def _raise_count(self, args):
        if len(args) == self._count:  # right count but not unpackable: not a sequence
            raise LaunchError(f"{self.kernel_name}(): arguments must be a tuple, got "
                              f"{type(args).__name__}")
        names = ", ".join(p.name for p in self.params)
        raise LaunchError(f"{self.kernel_name}(): expects {self._count} runtime arguments "
                          f"({names}), got {len(args)}")

    def _diagnose_scalars(self, args):
        for param, value in zip(self.params, args):
            if param.kind != "ptr":
                _check_scalar(self, param, value)


def _generate_pack(packer):
    """Build `pack(args)` for this signature, unrolled: a tuple unpack, an inline fast check
    per pointer (our Array of the right dtype and device), a converter call for bool/bf16, and
    one pack_into. Generated from the ABI alone (names are a0, a1, ...), so no user text is
    evaluated; any argument the inline checks do not accept goes to the precise converters."""
    names = [f"a{i}" for i in range(len(packer.params))]
    scope = {"Array": Array, "struct_error": struct.error, "packer": packer,
             "pack_into": packer._struct.pack_into, "storage": packer._storage,
             "base": packer._base, "address": packer.address, "kind": packer.device_kind}
    lines = ["def pack(args):"]
    if names:
        lines += ["    try:", f"        {', '.join(names)}, = args",
                  "    except (ValueError, TypeError):", "        packer._raise_count(args)"]
    else:
        lines += ["    if len(args):", "        packer._raise_count(args)"]
    for name, param in zip(names, packer.params):
        if param.kind == "ptr":
            scope[f"D{name}"] = _accepted_dtypes(param)[0]
            scope[f"C{name}"] = _converter(packer, param)
            lines += [f"    if type({name}) is Array and {name}._dtype is D{name} and "
                      f"{name}._device_kind == kind:",
                      f"        {name} = {name}._ptr", "    else:",
                      f"        {name} = C{name}({name})"]
        elif dtype_name(param.dtype) in ("bool", "bfloat16"):
            scope[f"C{name}"] = _converter(packer, param)
            lines.append(f"    {name} = C{name}({name})")
        else:   # struct packs True as 1: a bool for a number is a mistake, not a 1
            scope[f"P{name}"] = param
            lines += [f"    if {name}.__class__ is bool:",
                      f"        raise packer.error(P{name}, packer.expected(P{name}), {name})"]
    lines += ["    try:", f"        pack_into(storage, base, {', '.join(names)})",
              "    except (struct_error, TypeError, ValueError, OverflowError):",
              "        packer._diagnose_scalars(args)", "        raise",
              "    return address"]
    exec(compile("\n".join(lines), f"<pack {packer.kernel_name}>", "exec"), scope)
    return scope["pack"]


def _scalar_format(param) -> str:
    name = dtype_name(param.dtype)
    fmt = _FORMAT.get(name)
    if fmt is None:
        raise LaunchError(f"parameter '{param.name}': unsupported scalar dtype {name}")
    if struct.calcsize("=" + fmt) != param.size:  # e.g. bool passed as a 4-byte int
        fmt = {1: "B", 2: "H", 4: "I", 8: "Q"}[param.size]
    return fmt


def _check_scalar(packer, param, value):
    """Raise the precise LaunchError for a scalar that struct refused."""
    name = dtype_name(param.dtype)
    label = type_label(param)
    if name in ("float16", "float32", "float64", "bfloat16"):
        if not isinstance(value, (int, float, np.integer, np.floating)) or \
                isinstance(value, bool):
            raise packer.error(param, f"a float ({label})", value)
        try:
            struct.pack("=" + _FORMAT[name], value)
        except (OverflowError, struct.error):
            raise packer.error(param, f"a float that fits {label}", value) from None
        return
    if not isinstance(value, (int, np.integer)):
        raise packer.error(param, f"an integer ({label})", value)
    info = np.iinfo(np.dtype(name)) if name != "bool" else None
    if info is not None and not info.min <= int(value) <= info.max:
        raise packer.error(param, f"an integer in [{info.min}, {info.max}] ({label})", value)


def _converter(packer, param):
    name = dtype_name(param.dtype)
    if param.kind == "ptr":
        return _pointer_converter(packer, param)
    if name == "bool":
        def to_bool(value):
            if isinstance(value, (bool, np.bool_)) or (
                    isinstance(value, (int, np.integer)) and value in (0, 1)):
                return int(value)
            raise packer.error(param, "a bool (bool_)", value)
        return to_bool

    def to_bf16(value):
        if isinstance(value, (int, float, np.integer, np.floating)) and \
                not isinstance(value, bool):
            try:
                return f32_to_bf16_bits(float(value))
            except OverflowError:
                pass
        raise packer.error(param, "a float that fits bf16 (via f32)", value)
    return to_bf16


def _accepted_dtypes(param) -> tuple:
    if dtype_name(param.dtype) == "bfloat16":  # numpy has no bf16: raw uint16 storage
        return (np.dtype(np.uint16),)
    return (np.dtype(param.dtype),)


def _pointer_converter(packer, param):
    accepted = _accepted_dtypes(param)
    expected_dtype, kind = accepted[0], packer.device_kind

    def to_pointer(value):
        if type(value) is Array and value._device_kind == kind and (
                value._dtype is expected_dtype or value._dtype in accepted):
            return value._ptr
        return _resolve_pointer(packer, param, value)[0]
    return to_pointer


def _expected_text(packer, param) -> str:
    return f"a {packer.device_kind} array of {dtype_name(param.dtype)} ({type_label(param)})"


def _resolve_pointer(packer, param, value) -> tuple[int, int]:
    """(address, nbytes) of any accepted pointer argument, else a LaunchError."""
    accepted = _accepted_dtypes(param)
    if isinstance(value, Array):
        return _array_pointer(packer, param, value, accepted)
    if isinstance(value, np.ndarray):
        if packer.device_kind != "cpu":
            raise packer.error(param, _expected_text(packer, param), value,
                               "host memory: copy it first with pk.to_device(x)")
        _check_dtype_layout(packer, param, value, value.dtype, value.flags.c_contiguous)
        return value.ctypes.data, value.nbytes
    interface = getattr(value, "__cuda_array_interface__", None) \
        if packer.device_kind == "cuda" else None
    if interface is not None:
        return _cai_pointer(packer, param, value, interface)
    if hasattr(value, "__dlpack__"):
        return _dlpack_pointer(packer, param, value)
    raise packer.error(param, _expected_text(packer, param), value)


def _array_pointer(packer, param, value, accepted):
    if value.device.kind != packer.device_kind:
        raise packer.error(param, _expected_text(packer, param), value,
                           f"the kernel runs on {packer.device_kind}: move the data with "
                           "pk.to_device(x.numpy())")
    ordinal = getattr(value.device, "ordinal", None)
    if packer.device_ordinal is not None and ordinal not in (None, packer.device_ordinal):
        raise packer.error(param, f"an array on {packer.device_kind}:{packer.device_ordinal}",
                           value, f"this array is on {packer.device_kind}:{ordinal}")
    if value.dtype not in accepted:
        raise packer.error(param, _expected_text(packer, param), value)
    return value.ptr, value.nbytes


def _check_dtype_layout(packer, param, value, dtype, contiguous):
    if dtype not in _accepted_dtypes(param):
        raise packer.error(param, _expected_text(packer, param), value,
                           f"element type is {dtype_name(dtype)}")
    if not contiguous:
        raise packer.error(param, "C-contiguous memory", value, "pass a contiguous copy")


def _cai_pointer(packer, param, value, interface):
    shape = tuple(interface["shape"])
    dtype = np.dtype(interface["typestr"])
    strides = interface.get("strides")
    contiguous = strides is None or tuple(strides) == tuple(
        s * dtype.itemsize for s in _element_strides(shape))
    _check_dtype_layout(packer, param, value, dtype, contiguous)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return int(interface["data"][0]), nbytes


def _dlpack_pointer(packer, param, value):
    try:
        view = dlpack.read_dlpack(value)
    except (TypeError, BufferError, RuntimeError) as exc:
        raise packer.error(param, _expected_text(packer, param), value,
                           f"its __dlpack__ failed: {exc}") from None
    if view.device_type not in _DEVICE_TYPES[packer.device_kind]:
        raise packer.error(param, _expected_text(packer, param), value,
                           f"its DLPack device type is {view.device_type}")
    dtype = np.dtype(np.uint16) if view.dtype == "bfloat16" else view.dtype
    _check_dtype_layout(packer, param, value, dtype, view.is_c_contiguous())
    return view.ptr, view.nbytes


def _element_strides(shape) -> list:
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return strides[::-1]
