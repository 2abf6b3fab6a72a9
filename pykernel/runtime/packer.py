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
import sys

import numpy as np

from typing import Callable, NamedTuple

from ..errors import LaunchError
from . import array_args
from .arrays import Array
from .param_buffers import BufferPool, new_buffer
from .pointer_sources import ARRAY, NUMPY, TORCH, source_of
from .scalar_args import (check_scalar, converter, dtype_name, f32_to_bf16_bits,  # noqa: F401
                          scalar_format, type_label)

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

    def __init__(self, compiled, device_kind: str, device_ordinal: int | None = None,
                 device=None):
        self.kernel_name = compiled.name
        self.params = list(compiled.params)
        self.device_kind = device_kind
        self.device_ordinal = device_ordinal
        self.device = device       # its arrays pass the inline check (None: any of the kind)
        fields, offsets, offset = ["="], [], 0
        for param in self.params:
            fmt = FIELD_KINDS[param.kind].format(param)
            pad = (-offset) % param.align
            fields.append(f"{pad}x{fmt}" if pad else fmt)
            offset += pad
            offsets.append(offset)
            offset += struct.calcsize("=" + fmt)
        self._struct = struct.Struct("".join(fields))
        self.size = self._struct.size
        self.offsets = offsets
        # the buffer `pack` writes (the CPU entry point's argument, the full CUDA path's)
        self._storage, self._base, self.params_address, self.extra_address = \
            new_buffer(offsets, self.size)
        self.address = ctypes.addressof(self._storage) + self._base
        # buffers of their own for the generated CUDA launchers (one per launch in flight)
        self.pool = BufferPool(offsets, self.size)
        self._count = len(self.params)
        self._scopes = []          # the generated functions' globals (torch is bound late)
        self.torch_bound = False   # a torch tensor was passed: new functions bind it at once
        self.pack = _generate_pack(self)
        array_args.install(self)   # pk.Array parameters: expand each argument into its fields

    def pack(self, args) -> int:  # replaced per instance by the generated function
        """Check and write `args`; returns the buffer address (CPU entry point's argument)."""
        raise NotImplementedError

    def fused(self, function: str, guard: str, tail: list, scope: dict,
              pooled: bool = False):
        """A function `function(a0, a1, ..., /)` (the arguments positional, so a call binds
        them without building a tuple) that hands anything but exactly one positional argument
        per parameter, and any call where the expression `guard` holds, to
        `fallback(*args, **kwargs)` (in `scope`), else packs the arguments as `pack` does and
        runs `tail` (a device's launch: one Python frame for the whole launch); None for
        kernels whose arguments expand into several fields (n-d arrays), whose pack is a
        wrapper. `pooled`: pack into a buffer taken from `self.pool` instead of the shared
        one; `tail` then reads its addresses as `params` and `extra` and must hand it back
        with `give(slot)` once the driver has copied it."""
        if any(p.kind == "array" for p in self.params):
            return None
        return _generate(self, function, guard, tail, scope, pooled)

    def snapshot(self) -> tuple:
        """A private copy of the buffer as last packed: (owner to keep alive, its void*[] of
        field addresses, its `extra` array). A bound launch replays it while later packs
        overwrite the shared buffer."""
        storage, base, params, extra = new_buffer(self.offsets, self.size)
        ctypes.memmove(ctypes.addressof(storage) + base, self.address, self.size)
        return storage, params, extra

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
            if param.kind not in ("ptr", "tensormap"):
                check_scalar(self, param, value)


def _generate_pack(packer):
    """`pack(args)` -> the buffer's address (see `_generate`)."""
    return _generate(packer, "pack", None, ["return address"], {})


def _generate(packer, function: str, guard: str | None, tail: list, extra_scope: dict,
              pooled: bool = False):
    """Build `function`, unrolled: its arguments (see `_arguments`), each parameter's lines
    from its FIELD_KINDS entry, one pack_into (into a pool buffer when `pooled`), then `tail`
    lines. Generated from the ABI alone (names are a0, a1, ...) and the callers' fixed lines,
    so no user text is evaluated; any argument the inline checks do not accept goes to the
    precise converters."""
    names = [f"a{i}" for i in range(len(packer.params))]
    scope = {"Array": Array, "struct_error": struct.error, "packer": packer,
             "pack_into": packer._struct.pack_into, "storage": packer._storage,
             "base": packer._base, "address": packer.address, "kind": packer.device_kind,
             "array_device": packer.device, "Tensor": _NoTorchYet, "take": packer.pool.take,
             "give": packer.pool.give, "new_buffer": packer.pool.new, "NO_ARG": _NO_ARG,
             "given": _given, **extra_scope}
    lines, args = _arguments(function, names, guard)
    fields = []
    for name, param in zip(names, packer.params):
        code, written = FIELD_KINDS[param.kind].emit(packer, param, name, scope)
        lines += ["    " + line for line in code]
        fields += written
    # the pool's buffer is taken after every check that can raise, and given back on failure
    lines += ["    try:", "        storage, base, params, extra = slot = take()",
              "    except IndexError:", "        storage, base, params, extra = slot = new_buffer()"
              ] if pooled else []
    lines += ["    try:", f"        pack_into(storage, base, {', '.join(fields)})",
              "    except (struct_error, TypeError, ValueError, OverflowError):"]
    lines += ["        give(slot)"] if pooled else []
    lines += [f"        packer._diagnose_scalars({args})", "        raise"]
    lines += ["    " + line for line in tail]
    source = "\n".join(lines)
    exec(compile(source, f"<{function} {packer.kernel_name}>", "exec"), scope)
    packer._scopes.append(scope)
    if packer.torch_bound:
        _bind_torch(packer, [scope])
    generated = scope[function]
    generated.source = source      # what runs per launch: for debugging and profiling
    return generated


def _arguments(function: str, names: list, guard: str | None) -> tuple[list, str]:
    """(the lines that take the arguments into a0, a1, ..., an expression of them as a tuple).
    Without a guard: `function(args)`, one tuple, unpacked (a wrong count: the packer's error).
    With one: `function(a0=NO_ARG, ..., /, *more, **kwargs)`: a call binds its arguments
    straight into the frame; keywords, a wrong count or the guard go to `fallback`."""
    if guard is None:
        if not names:
            return [f"def {function}(args):", "    if len(args):",
                    "        return packer._raise_count(args)"], "args"
        return [f"def {function}(args):", "    try:", f"        {', '.join(names)}, = args",
                "    except (ValueError, TypeError):",
                "        return packer._raise_count(args)"], "args"
    values = f"({''.join(name + ', ' for name in names)})"
    if not names:
        return [f"def {function}(*more, **kwargs):", f"    if kwargs or more or {guard}:",
                "        return fallback(*more, **kwargs)"], values
    parameters = "".join(f"{name}=NO_ARG, " for name in names) + "/, *more, **kwargs"
    return [f"def {function}({parameters}):",
            f"    if kwargs or more or {names[-1]} is NO_ARG or {guard}:",
            f"        return fallback(*given{values}, *more, **kwargs)"], values


class _NoArgument:
    """The default of a generated launcher's parameters: that argument was not passed."""

    def __repr__(self):
        return "<no argument>"


_NO_ARG = _NoArgument()


def _given(*values) -> tuple:
    """The arguments a call passed (its trailing parameters left at NO_ARG dropped)."""
    return tuple(value for value in values if value is not _NO_ARG)


class _NoTorchYet:
    """What the generated code's `Tensor` names until a torch tensor is first passed (then
    torch.Tensor: see `_pointer_converter`); no value has this type."""


class FieldKind(NamedTuple):
    """How one kind of runtime parameter lands in the parameter buffer: `format(param)` ->
    its struct codes; `emit(packer, param, name, scope)` -> (source lines that turn argument
    `name` into field values, the names of those values in buffer order), adding what the
    lines call to `scope`. A new parameter kind is one entry in FIELD_KINDS."""
    format: Callable
    emit: Callable


def _pointer_emit(packer, param, name, scope):
    """Our Array of exactly the expected dtype inline, and a plain torch tensor of the
    expected dtype on this device (once torch tensors are seen: `_bind_torch`); anything else
    through its type's PointerSource (cached per type), and the precise error when that
    refuses."""
    scope[f"D{name}"] = np.dtype(_accepted_names(param)[0])
    scope[f"C{name}"] = _pointer_converter(packer, param)
    same_device = f"{name}._device is array_device" if packer.device is not None else \
        f"{name}._device_kind == kind"
    lines = [f"if type({name}) is Array and {name}._dtype is D{name} and {same_device}:",
             f"    {name} = {name}._ptr"]
    device = _TORCH_DEVICE.get(packer.device_kind, packer.device_ordinal)
    if device is not None:      # get_device(): the CUDA ordinal, -1 for host tensors
        scope[f"T{name}"] = None
        lines += [(f"elif type({name}) is Tensor and {name}.dtype is T{name} and "
                   f"{name}.get_device() == {int(device)} and {name}.is_contiguous():"),
                  f"    {name} = {name}.data_ptr()"]
    return lines + ["else:", f"    {name} = C{name}({name})"], [name]


_TORCH_DEVICE = {"cpu": -1}     # else the packer's ordinal (CUDA)


def _bind_torch(packer, scopes=None):
    """Point the generated functions' inline torch branch at torch.Tensor and each pointer
    parameter's torch dtype (torch dtypes are singletons: compared by identity): all of the
    packer's functions once a torch tensor was passed, and each function made after that."""
    torch = sys.modules["torch"]
    packer.torch_bound = True
    for scope in packer._scopes if scopes is None else scopes:
        scope["Tensor"] = torch.Tensor
        for index, param in enumerate(packer.params):
            if f"Ta{index}" in scope:
                scope[f"Ta{index}"] = getattr(torch, dtype_name(param.dtype), None)


def _scalar_emit(packer, param, name, scope):
    if dtype_name(param.dtype) in ("bool", "bfloat16"):
        scope[f"C{name}"] = converter(packer, param)
        return [f"{name} = C{name}({name})"], [name]
    scope[f"P{name}"] = param   # struct packs True as 1: a bool for a number is a mistake
    return [f"if {name}.__class__ is bool:",
            f"    raise packer.error(P{name}, packer.expected(P{name}), {name})"], [name]


def _array_emit(packer, param, name, scope):
    """An n-d array's data address: array_args.install already turned the argument into its
    address (then its extents and strides, which are scalar fields of their own)."""
    return [], [name]


def _tensormap_emit(packer, param, name, scope):
    """A pk.tensor_map result for this device kind: its 128 bytes, by value."""
    from .tensor_map import TiledTensorMap
    scope["TiledTensorMap"], scope[f"P{name}"] = TiledTensorMap, param
    return [f"if type({name}) is not TiledTensorMap or {name}.device_kind != kind:",
            (f"    raise packer.error(P{name}, 'a tensor map of a ' + kind + ' array "
             f"(pk.tensor_map)', {name})"),
            f"{name} = {name}.data"], [name]


FIELD_KINDS = {"ptr": FieldKind(lambda param: "Q", _pointer_emit),
               "array": FieldKind(lambda param: "Q", _array_emit),
               "tensormap": FieldKind(lambda param: f"{param.size}s", _tensormap_emit),
               "scalar": FieldKind(scalar_format, _scalar_emit)}


def _accepted_names(param) -> tuple:
    """Element types a pointer parameter takes, as dtype names (the first: what our Arrays
    hold). numpy has no bf16: Ptr[bf16] takes uint16 storage, and torch's bfloat16."""
    if dtype_name(param.dtype) == "bfloat16":
        return ("uint16", "bfloat16")
    return (dtype_name(param.dtype),)


def _pointer_converter(packer, param):
    """value -> address through the fast function of the value's type (built on first
    sight of each type), else the precise LaunchError."""
    accepted = frozenset(_accepted_names(param))
    kind, ordinal = packer.device_kind, packer.device_ordinal
    fast_by_type = {}

    def to_pointer(value):
        cls = value.__class__
        fast = fast_by_type.get(cls, _UNSEEN)
        if fast is _UNSEEN:
            source = source_of(cls)
            fast = fast_by_type[cls] = source.fast(accepted, kind, ordinal)
            if source is TORCH:
                _bind_torch(packer)
        if fast is not None:
            address = fast(value)
            if address is not None:
                return address
        return _resolve_pointer(packer, param, value)[0]
    return to_pointer


_UNSEEN = object()


def _expected_text(packer, param) -> str:
    return f"a {packer.device_kind} array of {dtype_name(param.dtype)} ({type_label(param)})"


def _resolve_pointer(packer, param, value) -> tuple[int, int]:
    """(address, nbytes) of any accepted pointer argument, else the LaunchError that says
    what is wrong with it (the slow path: every check spelled out)."""
    source = source_of(type(value))
    view = source.view(value)
    expected = _expected_text(packer, param)
    if view is None:
        raise packer.error(param, expected, value)
    if not view.dtype:                   # its protocol failed
        raise packer.error(param, expected, value, view.hint)
    kind = packer.device_kind
    if view.device != kind:
        if source is ARRAY:
            hint = (f"the kernel runs on {kind}: move the data with "
                    "pk.to_device(x.numpy())")
        elif source is NUMPY:
            hint = "host memory: copy it first with pk.to_device(x)"
        else:
            hint = view.hint or f"it is on {view.device}"
        raise packer.error(param, expected, value, hint)
    ordinal = packer.device_ordinal
    if ordinal is not None and view.ordinal not in (None, ordinal):
        raise packer.error(param, f"an array on {kind}:{ordinal}", value,
                           f"this array is on {kind}:{view.ordinal}")
    if view.dtype not in _accepted_names(param):
        raise packer.error(param, expected, value,
                           "" if source is ARRAY else f"element type is {view.dtype}")
    if not view.contiguous:
        raise packer.error(param, "C-contiguous memory", value, "pass a contiguous copy")
    return view.address, view.nbytes
