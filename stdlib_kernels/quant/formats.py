"""The one table of GGUF/ggml tensor formats shared by the numpy references and the GPU kernels.

Input: a ggml type name ("Q4_K", "F16", ...). Output: its `QuantFormat` (elements and bytes per
block, the `gguf.GGMLQuantizationType` member). Field layouts (little-endian, f16 = IEEE half)
are the comments beside each entry; blocks are stored back to back along a row.
"""
from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType

QK_K = 256  # super-block length of the K-quants


@dataclass(frozen=True)
class QuantFormat:
    name: str
    block_elems: int
    block_bytes: int
    ggml_type: GGMLQuantizationType


def _fmt(name: str, block_elems: int, block_bytes: int) -> QuantFormat:
    return QuantFormat(name, block_elems, block_bytes, GGMLQuantizationType[name])


FORMATS: dict[str, QuantFormat] = {f.name: f for f in (
    _fmt("F32", 1, 4),
    _fmt("F16", 1, 2),
    _fmt("BF16", 1, 2),      # top 16 bits of the f32, rounded to nearest even
    _fmt("Q4_0", 32, 18),    # d:f16 | qs:16 B; x[j] = low nibble of qs[j], x[j+16] = high; (q-8)*d
    _fmt("Q4_1", 32, 20),    # d:f16 | m:f16 | qs:16 B; q*d + m
    _fmt("Q5_0", 32, 22),    # d:f16 | qh:u32 (5th bit of x[j] = bit j) | qs:16 B; (q-16)*d
    _fmt("Q5_1", 32, 24),    # d:f16 | m:f16 | qh:u32 | qs:16 B; q*d + m
    _fmt("Q8_0", 32, 34),    # d:f16 | qs:i8[32]; q*d
    # Activation format. d:f16 | s:f16 | qs:i8[32]. s = d*sum(q) as ggml's CPU stores it (ours;
    # llama.cpp's CUDA quantize_q8_1 stores sum(x)). gguf-py's size table still says 40 B.
    _fmt("Q8_1", 32, 36),
    # scales:16 B (low nibble scale, high nibble min) | qs:64 B (2 bits) | d:f16 | dmin:f16
    _fmt("Q2_K", QK_K, 84),
    # hmask:32 B (high bit, 0 means -4) | qs:64 B (2 bits) | scales:12 B (16 x 6 bits, -32) | d:f16
    _fmt("Q3_K", QK_K, 110),
    # d:f16 | dmin:f16 | scales:12 B (8 x 6-bit scale + 8 x 6-bit min) | qs:128 B (4 bits)
    _fmt("Q4_K", QK_K, 144),
    # d:f16 | dmin:f16 | scales:12 B | qh:32 B (5th bits) | qs:128 B (low 4 bits)
    _fmt("Q5_K", QK_K, 176),
    # ql:128 B (low 4 bits) | qh:64 B (high 2 bits) | scales:i8[16] | d:f16; (q-32)*d*scale
    _fmt("Q6_K", QK_K, 210),
    # d:f16 | qs:16 B, bit j (byte j/8, bit j%8) set means +d, clear means -d
    _fmt("Q1_0", 128, 18),
)}


def get_format(name: str) -> QuantFormat:
    """The format called `name` (a ggml type name); ValueError listing the known ones if absent."""
    try:
        return FORMATS[name]
    except KeyError:
        known = ", ".join(FORMATS)
        raise ValueError(f"unknown quantization type {name!r}; known types: {known}") from None


def check_byte_rows(raw, fmt: QuantFormat, n: int, per_row: int) -> None:
    """ValueError unless `raw` (a numpy or device array) is uint8 holding whole rows of
    `per_row` bytes (rows of n elements): the one check for both codecs' block input."""
    if raw.dtype != "uint8":
        raise ValueError(f"{fmt.name}: expected uint8 block bytes, got dtype {raw.dtype}")
    if raw.ndim == 2 and raw.shape[1] != per_row:
        raise ValueError(f"{fmt.name}: a row of {n} elements takes {per_row} bytes, got rows "
                         f"of {raw.shape[1]} bytes")
    if raw.ndim not in (1, 2) or raw.size == 0 or raw.size % per_row:
        raise ValueError(f"{fmt.name}: expected a whole number of {per_row}-byte rows ({n} "
                         f"elements each), got {raw.size} bytes in shape {raw.shape}")
