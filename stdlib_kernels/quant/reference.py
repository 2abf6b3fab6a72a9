"""numpy reference codecs for the GGUF tensor formats, bit-exact with ggml's reference quantizers.

    quantize(x, "Q6_K")       float32 (rows, n) or (n,)       -> uint8 (rows, row_bytes)
    dequantize(raw, "Q6_K", n) uint8 (rows, row_bytes) or flat -> float32 (rows, n)
    quantize_q8_1(x)          float32 (rows, n)               -> uint8 (rows, n//32*36)
    row_bytes("Q6_K", n), block_size("Q6_K") -> (elements, bytes)

Type names are ggml's (formats.py). Quantizers reproduce ggml's `quantize_row_*_ref` (no
importance matrix): gguf-py's where it is bit-exact (BF16, Q4_0/1, Q5_0/1, Q8_0), our ports for
the K-quants, Q1_0 and MXFP4. Dequantizers are gguf-py's, plus Q1_0 and Q8_1 here.
"""
from __future__ import annotations

import numpy as np
from gguf import quants as gguf_quants

from . import reference_kquants as kq
from .formats import QuantFormat, check_byte_rows, get_format
from .reference_legacy import quantize_legacy
from .reference_mxfp4 import quantize_mxfp4_blocks
from .reference_numerics import F32, roundf, seq_sum, to_f16

_KQUANTS = {"Q2_K": kq.quantize_q2_k, "Q3_K": kq.quantize_q3_k, "Q4_K": kq.quantize_q4_k,
            "Q5_K": kq.quantize_q5_k, "Q6_K": kq.quantize_q6_k}
_LEGACY = ("BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
# Super-blocks per call of a K-quant port: big enough to amortise numpy's per-call cost, small
# enough that the (n, B) temporaries stay in cache.
_KQUANT_CHUNK = 1024


def block_size(type_name: str) -> tuple[int, int]:
    """(elements, bytes) of one block of `type_name`."""
    fmt = get_format(type_name)
    return fmt.block_elems, fmt.block_bytes


def row_bytes(type_name: str, n: int) -> int:
    """Bytes of one row of n elements; ValueError if n is not a whole number of blocks."""
    fmt = get_format(type_name)
    _check_row_length(fmt, n)
    return n // fmt.block_elems * fmt.block_bytes


def _check_row_length(fmt: QuantFormat, n: int) -> None:
    if n <= 0 or n % fmt.block_elems:
        raise ValueError(f"{fmt.name}: row length {n} is not a positive multiple of the "
                         f"{fmt.name} block size ({fmt.block_elems} elements)")


def _as_rows(x: np.ndarray, fmt: QuantFormat) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2:
        raise ValueError(f"{fmt.name}: expected a float32 array (rows, n) or (n,), "
                         f"got shape {x.shape}")
    _check_row_length(fmt, x.shape[1])
    return np.ascontiguousarray(x, dtype=F32)


def quantize(x: np.ndarray, type_name: str) -> np.ndarray:
    """Quantize rows of float32 to ggml `type_name` blocks: uint8 (rows, row_bytes)."""
    fmt = get_format(type_name)
    rows = _as_rows(x, fmt)
    # overflow to inf/nan is ggml's behaviour too (f16 scales of huge values): no warnings
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        out = _quantize_rows(rows, fmt)
    return np.ascontiguousarray(out).reshape(rows.shape[0], -1)


def _quantize_rows(rows: np.ndarray, fmt: QuantFormat) -> np.ndarray:
    blocks = rows.reshape(-1, fmt.block_elems)
    if fmt.name == "F32":
        out = blocks.view(np.uint8)
    elif fmt.name == "F16":
        out = to_f16(blocks).view(np.uint8)
    elif fmt.name == "Q8_1":
        out = _quantize_q8_1_blocks(blocks)
    elif fmt.name == "Q1_0":
        out = _quantize_q1_0_blocks(blocks)
    elif fmt.name == "MXFP4":
        out = quantize_mxfp4_blocks(blocks)
    elif fmt.name in _KQUANTS:
        out = _in_chunks(_KQUANTS[fmt.name], blocks, fmt.block_bytes)
    elif fmt.name in _LEGACY:
        out = quantize_legacy(rows, fmt.name)
    else:
        raise ValueError(f"{fmt.name}: no reference quantizer for this type")
    return out


def _in_chunks(quantize_blocks, blocks: np.ndarray, nbytes: int) -> np.ndarray:
    out = np.empty((blocks.shape[0], nbytes), dtype=np.uint8)
    for start in range(0, blocks.shape[0], _KQUANT_CHUNK):
        stop = start + _KQUANT_CHUNK
        out[start:stop] = quantize_blocks(blocks[start:stop])
    return out


def dequantize(raw, type_name: str, n: int) -> np.ndarray:
    """Decode ggml `type_name` rows of n elements: float32 (rows, n).

    raw: uint8 (rows, row_bytes), or flat bytes / 1-D uint8 holding whole rows back to back.
    """
    fmt = get_format(type_name)
    per_row = row_bytes(type_name, n)
    data = _as_byte_rows(raw, fmt, n, per_row)
    with np.errstate(over="ignore", invalid="ignore"):
        if fmt.name == "Q1_0":
            values = _dequantize_q1_0_blocks(data.reshape(-1, fmt.block_bytes))
        elif fmt.name == "Q8_1":
            values = _dequantize_q8_1_blocks(data.reshape(-1, fmt.block_bytes))
        else:  # whole rows: gguf-py works on groups of rows, so blocks-as-rows would be slow
            values = gguf_quants.dequantize(data, fmt.ggml_type)
    return np.ascontiguousarray(values, dtype=F32).reshape(data.shape[0], n)


def _as_byte_rows(raw, fmt: QuantFormat, n: int, per_row: int) -> np.ndarray:
    if isinstance(raw, (bytes, bytearray, memoryview)):
        raw = np.frombuffer(raw, dtype=np.uint8)
    raw = np.asarray(raw)
    check_byte_rows(raw, fmt, n, per_row)
    return np.ascontiguousarray(raw).reshape(-1, per_row)


def quantize_q8_1(x: np.ndarray) -> np.ndarray:
    """Activations to Q8_1 as llama.cpp's CUDA quantize_q8_1 does: uint8 (rows, n//32*36).

    Per 32-block: d = amax/127, q = roundf(x/d) (0 when amax == 0) as llama.cpp's CUDA kernel;
    s = d * sum(q) as ggml's CPU quantizer (q8_1.py says why); d and s stored as f16.
    """
    return quantize(x, "Q8_1")


def _quantize_q8_1_blocks(blocks: np.ndarray) -> np.ndarray:
    amax = np.abs(blocks).max(axis=1)
    d = amax / F32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(amax[:, None] == 0, F32(0), roundf(blocks / d[:, None]))
    s = d * q.sum(axis=1, dtype=F32)          # |sum| <= 32 * 127: exact in f32
    header = np.stack([to_f16(d), to_f16(s)], axis=1).view(np.uint8)
    return np.concatenate([header, q.astype(np.int8).view(np.uint8)], axis=1)


def _dequantize_q8_1_blocks(blocks: np.ndarray) -> np.ndarray:
    d = blocks[:, :2].copy().view(np.float16).astype(F32)
    return d * blocks[:, 4:].view(np.int8).astype(F32)


def _quantize_q1_0_blocks(blocks: np.ndarray) -> np.ndarray:
    """Q1_0 (18 B per 128): d = fp16(sum|x| / 128) summed in order; bit j set when x[j] >= 0."""
    d = seq_sum(np.abs(blocks).T) / F32(blocks.shape[1])
    bits = np.packbits(blocks >= 0, axis=1, bitorder="little")
    return np.concatenate([to_f16(d)[:, None].view(np.uint8), bits], axis=1)


def _dequantize_q1_0_blocks(blocks: np.ndarray) -> np.ndarray:
    d = blocks[:, :2].copy().view(np.float16).astype(F32)
    bits = np.unpackbits(blocks[:, 2:], axis=1, bitorder="little").astype(bool)
    return np.where(bits, d, -d)
