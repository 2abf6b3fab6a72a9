"""Quantize and dequantize GGUF tensor rows with the pykernel kernels, on the current device.

    quantize(x, "Q6_K")                     x: (rows, n) or (n,) float32 / float16 / bfloat16
                                            -> uint8 (rows, row_bytes)
    dequantize(raw, "Q6_K", n, np.float16)  raw: uint8 (rows, row_bytes) or flat whole rows
                                            -> (rows, n) float32 or float16

numpy inputs give numpy outputs (copied to and from the current device); `pykernel.Array`
inputs give `pykernel.Array` outputs on the same device, so a caller can keep data on the GPU.
bfloat16 has no numpy dtype: pass its raw bits as uint16. Results are bit-exact with the numpy
reference codecs (reference.py) and with ggml. Rows that are not whole blocks and byte buffers
that do not hold whole rows are rejected before any kernel runs.
"""
from __future__ import annotations

import numpy as np

import pykernel as pk

from .dequant_kernels import dequantize_rows, dequantize_rows8
from .formats import DEQUANT, QUANTIZE, QuantFormat, check_byte_rows, get_format, type_ids
from .quantize_kernels import convert_floats, quantize_blocks32, quantize_q1_0
from .quantize_kquant_kernels import quantize_kquant

DEVICE_TYPES = tuple(type_ids(DEQUANT))   # the types both directions serve (formats.py)
_INPUT_DTYPES = {np.dtype(np.float32): False, np.dtype(np.float16): False,
                 np.dtype(np.uint16): True}          # uint16 = bfloat16 bits
_OUTPUT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))
# Largest launch in elements: keeps every element and byte index of a launch inside i32.
_MAX_LAUNCH_ELEMS = 1 << 28
_THREADS = 128
# K-quant launch shape: (sub-blocks per super-block, elements per sub-block, largest level).
_KQUANT = {"Q2_K": (16, 16, 3), "Q3_K": (16, 16, 0), "Q4_K": (8, 32, 15),
           "Q5_K": (8, 32, 31), "Q6_K": (16, 16, 0)}


def _device_format(type_name: str, family: str) -> QuantFormat:
    fmt = get_format(type_name)
    if family not in fmt.kernels:
        raise ValueError(f"{fmt.name}: no device kernel for this type; device types: "
                         f"{', '.join(type_ids(family))}")
    return fmt


def _check_row_length(fmt: QuantFormat, n: int) -> None:
    if n <= 0 or n % fmt.block_elems:
        raise ValueError(f"{fmt.name}: row length {n} is not a positive multiple of the "
                         f"{fmt.name} block size ({fmt.block_elems} elements)")


def _to_device_rows(x, fmt: QuantFormat):
    """-> (device array (rows, n), returns_numpy)."""
    if isinstance(x, pk.Array):
        if x.device is not pk.current_device():
            raise ValueError(f"{fmt.name}: input lives on {x.device!r}, not on the current "
                             f"device {pk.current_device()!r}")
        arr, is_numpy = x, False
    else:
        arr, is_numpy = np.asarray(x), True
    if arr.dtype not in _INPUT_DTYPES:
        raise ValueError(f"{fmt.name}: expected float32, float16 or bfloat16 bits (uint16) "
                         f"rows, got dtype {arr.dtype}")
    if arr.ndim == 1:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2:
        raise ValueError(f"{fmt.name}: expected rows (rows, n) or one row (n,), got shape "
                         f"{arr.shape}")
    _check_row_length(fmt, arr.shape[1])
    if is_numpy:
        arr = pk.to_device(np.ascontiguousarray(arr))
    return arr, is_numpy


def quantize(x, type_name: str):
    """Quantize rows to ggml `type_name` blocks on the current device: uint8 (rows, row_bytes)."""
    fmt = _device_format(type_name, QUANTIZE)
    rows, is_numpy = _to_device_rows(x, fmt)
    n_rows, n = rows.shape
    per_row = n // fmt.block_elems * fmt.block_bytes
    out = pk.empty((n_rows, per_row), np.uint8)
    step = max(1, _MAX_LAUNCH_ELEMS // n)
    for start in range(0, n_rows, step):
        stop = min(n_rows, start + step)
        _quantize_launch(rows[start:stop].reshape(-1), out[start:stop].reshape(-1), fmt)
    return out.numpy() if is_numpy else out


def _quantize_launch(flat_x, flat_out, fmt: QuantFormat) -> None:
    bf16 = _INPUT_DTYPES[flat_x.dtype]
    dtype = flat_x.dtype
    n_blocks = flat_x.size // fmt.block_elems
    code = fmt.id
    if fmt.name in _KQUANT:
        subs, sub_len, nmax = _KQUANT[fmt.name]
        per_launch = _THREADS // subs
        grid = (n_blocks + per_launch - 1) // per_launch
        quantize_kquant[grid, _THREADS](flat_x, flat_out, n_blocks, code, subs, sub_len, nmax,
                                        _THREADS, per_launch, fmt.block_bytes, bf16, dtype)
    elif fmt.name == "Q1_0":
        quantize_q1_0[(n_blocks + _THREADS - 1) // _THREADS, _THREADS](
            flat_x, flat_out, n_blocks, bf16, dtype)
    elif fmt.block_elems == 32:
        quantize_blocks32[(n_blocks + _THREADS - 1) // _THREADS, _THREADS](
            flat_x, flat_out, n_blocks, code, fmt.block_bytes, bf16, dtype)
    else:  # F32, F16, BF16: one element per block
        convert_floats[(n_blocks + 255) // 256, 256](flat_x, flat_out, n_blocks, code, bf16,
                                                      dtype)


def _as_device_bytes(raw, fmt: QuantFormat, n: int, per_row: int):
    """-> (device uint8 array (rows, per_row), returns_numpy); ValueError unless whole rows."""
    is_numpy = not isinstance(raw, pk.Array)
    if is_numpy:
        if isinstance(raw, (bytes, bytearray, memoryview)):
            raw = np.frombuffer(raw, dtype=np.uint8)
        raw = np.asarray(raw)
    elif raw.device is not pk.current_device():
        raise ValueError(f"{fmt.name}: block bytes live on {raw.device!r}, not on the current "
                         f"device {pk.current_device()!r}")
    check_byte_rows(raw, fmt, n, per_row)
    rows = raw.reshape(raw.size // per_row, per_row)
    if is_numpy:
        rows = pk.to_device(np.ascontiguousarray(rows))
    return rows, is_numpy


def dequantize(raw, type_name: str, n: int, dtype=np.float32):
    """Decode ggml `type_name` rows of n elements on the current device: (rows, n) of dtype
    (float32, or float16 rounded to nearest even from the float32 value)."""
    fmt = _device_format(type_name, DEQUANT)
    dtype = np.dtype(dtype)
    if dtype not in _OUTPUT_DTYPES:
        raise ValueError(f"{fmt.name}: dequantize writes float32 or float16, not {dtype}")
    _check_row_length(fmt, n)
    per_row = n // fmt.block_elems * fmt.block_bytes
    rows, is_numpy = _as_device_bytes(raw, fmt, n, per_row)
    out = pk.empty((rows.shape[0], n), dtype)
    step = max(1, _MAX_LAUNCH_ELEMS // n)
    for start in range(0, rows.shape[0], step):
        stop = min(rows.shape[0], start + step)
        total = (stop - start) * n
        kernel, per_thread = (dequantize_rows8, 8) if n % 8 == 0 else (dequantize_rows, 1)
        kernel[(total // per_thread + 255) // 256, 256](
            rows[start:stop].reshape(-1), out[start:stop].reshape(-1), total, n, per_row,
            fmt.id, fmt.block_elems, fmt.block_bytes, dtype)
    return out.numpy() if is_numpy else out
