"""Embedding lookup: out[t] = table[ids[t]] * scale, for f32/f16 tables and for quantized
tables (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K rows) dequantized on the fly, with a numpy reference.

Input: table (vocab, n) f32/f16, or (vocab, row_bytes) uint8 GGUF blocks with `qtype`;
ids (tokens,) int32 on the device (read by the kernel: graph-replay friendly); scale (Gemma 3:
sqrt(n_embd)). Output: (tokens, n) f32 (or `out=`). An id outside [0, vocab) gives a NaN row
(the kernel cannot raise; NaN makes the bad id visible downstream).
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64, u8

from . import _launch as L
from .quant_blocks import BLOCK_SHAPES, TYPE_IDS, quant_element

NAN = float("nan")


@pk.kernel
def embedding_rows(table: Ptr["T", "ro"], ids: Ptr[i32, "ro"], out: Ptr[f32], n: i32,
                   vocab: i32, scale: f32, T: Const[pk.dtype]):
    t = pk.block_idx.x
    tok = ids[t]
    orow = out + i64(t) * i64(n)
    valid = tok >= 0 and tok < vocab
    src = table + i64(tok if valid else 0) * i64(n)
    for c in range(pk.thread_idx.x, n, pk.block_dim.x):
        orow[c] = f32(src[c]) * scale if valid else f32(NAN)


@pk.kernel
def embedding_quant_rows(table: Ptr[u8, "ro"], ids: Ptr[i32, "ro"], out: Ptr[f32], n: i32,
                         row_bytes: i32, vocab: i32, scale: f32, QTYPE: Const[int]):
    t = pk.block_idx.x
    tok = ids[t]
    orow = out + i64(t) * i64(n)
    valid = tok >= 0 and tok < vocab
    src = table + i64(tok if valid else 0) * i64(row_bytes)
    for c in range(pk.thread_idx.x, n, pk.block_dim.x):
        orow[c] = quant_element(src, c, QTYPE) * scale if valid else f32(NAN)


def embedding(table, ids, *, qtype: str | None = None, n: int | None = None,
              scale: float = 1.0, out=None, stream=None):
    """Rows `ids` of `table` times `scale` -> (tokens, n) f32. Quantized tables: uint8
    (vocab, row_bytes) with qtype in Q4_0, Q4_1, Q8_0, Q4_K, Q6_K (n inferred from row_bytes)."""
    table = L.as_array(table, "embedding: table")
    ids = L.as_array(ids, "embedding: ids", np.int32)
    if table.ndim != 2:
        raise ValueError(f"embedding: table must be 2-D (vocab, n), got shape {table.shape}")
    tokens, vocab = ids.size, table.shape[0]
    if qtype is None:
        if table.dtype not in (np.float32, np.float16):
            raise TypeError(f"embedding: table must be float32/float16 (or uint8 with qtype), "
                            f"got {table.dtype}")
        n = table.shape[1]
        out = L.output(out, "embedding", (tokens, n), np.float32)
        args = (table, ids, out, n, vocab, scale)
        L.launch(embedding_rows, tokens, L.threads_for(n, 256), args, (("T", table.dtype),),
                 stream)
        return out
    if qtype not in TYPE_IDS:
        raise ValueError(f"embedding: qtype must be one of {sorted(TYPE_IDS)}, got {qtype!r}")
    if table.dtype != np.uint8:
        raise TypeError(f"embedding: a {qtype} table must be uint8 block bytes, got {table.dtype}")
    elems, nbytes = BLOCK_SHAPES[TYPE_IDS[qtype]]
    row_bytes = table.shape[1]
    if row_bytes % nbytes:
        raise ValueError(f"embedding: {qtype} rows must be whole {nbytes}-byte blocks, got "
                         f"{row_bytes} bytes")
    n = row_bytes // nbytes * elems
    out = L.output(out, "embedding", (tokens, n), np.float32)
    args = (table, ids, out, n, row_bytes, vocab, scale)
    L.launch(embedding_quant_rows, tokens, L.threads_for(n, 256), args,
             (("QTYPE", TYPE_IDS[qtype]),), stream)
    return out


def embedding_reference(table, ids, scale=1.0, qtype=None):
    """numpy lookup; quantized rows decoded by stdlib_kernels.quant.reference."""
    ids = np.asarray(ids)
    if qtype is None:
        return np.asarray(table, np.float32)[ids].astype(np.float64) * scale
    from .quant import reference
    elems, nbytes = BLOCK_SHAPES[TYPE_IDS[qtype]]
    rows = np.asarray(table)[ids]
    n = rows.shape[1] // nbytes * elems
    return reference.dequantize(rows, qtype, n).astype(np.float64) * scale
