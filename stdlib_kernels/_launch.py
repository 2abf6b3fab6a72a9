"""Launch plumbing shared by the core kernels: argument coercion, output allocation, vector-width
and block-size choices, and a launch path that skips the generic `kernel[grid, block]` binder.

Input: kernels, launch geometry, runtime arguments in parameter order and the compile-time
specialization as a tuple of (name, value) pairs. Output: the launch on the current device.
A specialization is compiled once per (kernel, arch, spec) and kept in `_COMPILED`, so a
repeated call costs a dict lookup plus the device's argument packing and launch.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from pykernel import compile_pool
from pykernel.runtime.arrays import Array, empty, to_device, zeros
from pykernel.runtime.device import current_device

_COMPILED: dict = {}
VEC = 4           # elements per vector load (16 bytes of f32, 8 of f16)
MAX_THREADS = 1024


def launch(kernel, grid, block, args, spec: tuple, stream=None, shared_bytes: int = 0,
           bounds: tuple[int, int] | None = None):
    """Launch `kernel` with runtime `args` (parameter order) and Const/dtype values `spec`.
    `bounds` = (max_threads, min_blocks): launch bounds for this specialization (ptxas then
    keeps registers low enough for min_blocks blocks of max_threads threads per SM)."""
    device = current_device()
    if compile_pool.RECORDING is not None and compile_pool.record(
            kernel, device.arch, dict(spec), _options(kernel, bounds)):
        return     # pk.precompile's dry run: recorded, not launched
    key = (kernel, device.arch, spec, bounds)
    compiled = _COMPILED.get(key)
    if compiled is None:
        compiled = _COMPILED[key] = kernel.compile(device.arch, _options(kernel, bounds),
                                                   **dict(spec))
    grid = grid if isinstance(grid, tuple) else (grid, 1, 1)
    block = block if isinstance(block, tuple) else (block, 1, 1)
    device.launch(compiled, grid, block, args, stream=stream, shared_bytes=shared_bytes)


def _options(kernel, bounds):
    return kernel.options if bounds is None else dataclasses.replace(
        kernel.options, max_threads=bounds[0], min_blocks=bounds[1])


_SM_COUNTS: dict = {}
CPU_MULTIPROCESSORS = 132   # the CPU target picks the same geometry as an H100/H200


def multiprocessors() -> int:
    """Streaming multiprocessors of the current device (CPU_MULTIPROCESSORS on the CPU)."""
    device = current_device()
    if device not in _SM_COUNTS:
        core = getattr(device, "core", None)
        _SM_COUNTS[device] = (CPU_MULTIPROCESSORS if core is None
                              else int(core.properties.multiprocessor_count))
    return _SM_COUNTS[device]


_SHARED_PER_SM: dict = {}


def blocks_per_multiprocessor(shared_bytes: int, threads: int) -> int:
    """How many blocks of `threads` threads and `shared_bytes` dynamic shared memory fit on one
    multiprocessor by shared memory and threads (registers not counted; at least 1). The CPU
    target answers as an H100 (228 KB, 1 KB reserved per block, 2048 threads)."""
    device = current_device()
    if device not in _SHARED_PER_SM:
        core = getattr(device, "core", None)
        props = None if core is None else core.properties
        _SHARED_PER_SM[device] = (233472, 1024) if props is None else (
            int(props.max_shared_memory_per_multiprocessor),
            int(props.reserved_shared_memory_per_block))
    per_sm, reserved = _SHARED_PER_SM[device]
    return max(1, min(per_sm // (shared_bytes + reserved), 2048 // threads))


_ZEROS: dict = {}


def zero_i32() -> Array:
    """One int32 zero on the current device, made once: an argument for an int32 pointer
    parameter that a launch does not use (nothing is allocated per call, so the launch stays
    capturable in a CUDA graph)."""
    device = current_device()
    if id(device) not in _ZEROS:
        _ZEROS[id(device)] = (device, zeros(1, np.int32))
    return _ZEROS[id(device)][1]


def as_array(value, name: str, dtype=None) -> Array:
    """A device array for `value`: Arrays pass through (dtype checked), numpy is uploaded."""
    if isinstance(value, Array):
        if dtype is not None and value.dtype != np.dtype(dtype):
            raise TypeError(f"{name}: expected dtype {np.dtype(dtype)}, got {value.dtype}")
        if value.device is not current_device():
            raise ValueError(f"{name}: array lives on {value.device!r}, the current device is "
                             f"{current_device()!r}")
        return value
    host = np.asarray(value)
    if dtype is not None:
        host = host.astype(dtype, copy=False)
    return to_device(host)


def output(out, name: str, shape: tuple, dtype) -> Array:
    """`out` checked against (shape, dtype), or a new array when `out` is None."""
    dtype = np.dtype(dtype)
    if out is None:
        return empty(shape, dtype)
    if not isinstance(out, Array):
        raise TypeError(f"{name}: out= must be a pykernel Array, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype:
        raise ValueError(f"{name}: out= is {out.shape} {out.dtype}, expected {shape} {dtype}")
    return out


def vector_width(n: int, *arrays) -> int:
    """VEC when every row of n elements starts on a VEC-element boundary of each array."""
    if n % VEC:
        return 1
    for a in arrays:
        if a is not None and a.ptr % (VEC * a.itemsize):
            return 1
    return VEC


def threads_for(items: int, cap: int = MAX_THREADS) -> int:
    """A power of two >= items (one item per thread), at least a warp, at most `cap`."""
    threads = 32
    while threads < items and threads < cap:
        threads *= 2
    return threads


# Elementwise kernels take up to `max_units` 4-element units per thread (all loaded before any
# is used) where memory bandwidth matters; one unit (the most threads) for a few rows.
FEW_ROWS = 64


def elementwise_geometry(rows: int, n: int, max_units: int) -> tuple[int, int, tuple]:
    """(units per thread, threads per block, grid) for grid x = row, y = column chunk."""
    units = -(-n // 4)
    per_thread = 1 if rows < FEW_ROWS else min(max_units, -(-units // 32))
    threads = threads_for(-(-units // per_thread), 256)
    return per_thread, threads, (rows, -(-units // (per_thread * threads)), 1)


def rows_and_length(x: Array, name: str) -> tuple[int, int]:
    """(rows, n) for an array whose last axis is the row (1-D = one row)."""
    if x.ndim == 0:
        raise ValueError(f"{name}: expected at least a 1-D array, got a scalar")
    n = x.shape[-1]
    if n == 0 or x.size == 0:
        raise ValueError(f"{name}: empty rows (shape {x.shape})")
    return x.size // n, n


_DUMMIES: dict = {}


def dummy(dtype) -> Array:
    """A small array standing in for an absent optional pointer (never read: a Const flag
    compiles the access out)."""
    device = current_device()
    key = (device, np.dtype(dtype))
    if key not in _DUMMIES:
        _DUMMIES[key] = to_device(np.zeros(VEC, dtype))
    return _DUMMIES[key]


def either(value, fallback):
    return fallback if value is None else value
