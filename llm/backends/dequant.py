"""Raw GGUF tensor bytes -> float32 ndarray of the tensor's numpy shape.

Fast numpy paths for the block formats the default models use most (Q4_0, Q4_1, Q5_0, Q8_0),
written to give bit-identical floats to `gguf.quants.dequantize` (same f32 operation order) but
with fewer temporaries and in cache-sized chunks: loading SmolLM2 drops from ~2.2 s to well under
1 s. Every other type in `WEIGHT_TYPES` goes through `gguf.quants.dequantize`; the loader
rejects tensors of any other type (F64, integer tensors, the Q8_1/Q8_K activation formats) by
name before it dequantizes anything.
"""
from __future__ import annotations

import numpy as np
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q

CHUNK_BLOCKS = 1 << 14  # blocks per chunk: keeps the temporaries inside the L2/L3 caches

# Tensor types usable as weights: those this module or gguf-py can dequantize (names, since
# older gguf-py releases lack some). Integer and F64 tensors are valid GGUF but not weights.
_WEIGHT_TYPE_NAMES = (
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
    "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_NL",
    "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4")
WEIGHT_TYPES = frozenset(
    Q[name] for name in _WEIGHT_TYPE_NAMES
    if name in Q.__members__ and (name in ("F32", "F16") or Q[name] in quants._type_traits))


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The f16 field at byte `start` of each block, as an (n_blocks, 1) float32 column."""
    return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    # Q4 layout: low nibbles are elements 0..15, high nibbles elements 16..31 of the block
    q = np.empty((qs.shape[0], 32), dtype=np.uint8)
    np.bitwise_and(qs, 15, out=q[:, :16])
    np.right_shift(qs, 4, out=q[:, 16:])
    return q


def _q4_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # Q4_0 block (18 B): d:f16 | qs[16]; x = (q - 8) * d
    q = _nibbles(blocks[:, 2:18]).astype(np.int8)
    q -= 8
    np.multiply(_f16(blocks, 0), q, out=out)


def _q4_1(blocks: np.ndarray, out: np.ndarray) -> None:
    # Q4_1 block (20 B): d:f16 | m:f16 | qs[16]; x = q * d + m
    np.multiply(_f16(blocks, 0), _nibbles(blocks[:, 4:20]), out=out)
    out += _f16(blocks, 2)


def _q5_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # Q5_0 block (22 B): d:f16 | qh:u32 | qs[16]; bit j of qh is the 5th bit of element j
    qh = blocks[:, 2:6].copy().view("<u4")
    high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4
    q = (_nibbles(blocks[:, 6:22]) | high).astype(np.int8)
    q -= 16
    np.multiply(_f16(blocks, 0), q, out=out)


def _q8_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # Q8_0 block (34 B): d:f16 | qs: i8[32]; x = q * d
    np.multiply(_f16(blocks, 0), blocks[:, 2:34].view(np.int8), out=out)


_FAST = {Q.Q4_0: _q4_0, Q.Q4_1: _q4_1, Q.Q5_0: _q5_0, Q.Q8_0: _q8_0}


def dequantize(raw: np.ndarray, ggml_type: Q, shape: tuple[int, ...],
               out: np.ndarray | None = None) -> np.ndarray:
    """uint8 bytes of one tensor -> float32 array of `shape` (numpy order), written into `out`
    (a C-contiguous float32 array of that shape) when given. F32 without `out` is a view."""
    if ggml_type == Q.F32 and out is None:
        return raw.view(np.float32).reshape(shape)
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    if out.dtype != np.float32 or not out.flags.c_contiguous or out.shape != tuple(shape):
        raise ValueError(f"dequantize needs a C-contiguous float32 output of shape {shape}")
    block, block_bytes = GGML_QUANT_SIZES[ggml_type]
    fast = _FAST.get(ggml_type)
    if ggml_type in (Q.F32, Q.F16):
        out[...] = raw.view(np.float32 if ggml_type == Q.F32 else np.float16).reshape(shape)
    elif fast is None:
        rows = raw.reshape(-1, shape[-1] // block * block_bytes)
        out[...] = quants.dequantize(rows, ggml_type).reshape(shape)
    else:
        blocks = raw.reshape(-1, block_bytes)
        flat = out.reshape(-1, block)
        for start in range(0, blocks.shape[0], CHUNK_BLOCKS):
            stop = start + CHUNK_BLOCKS
            fast(blocks[start:stop], flat[start:stop])
    return out
