"""Quantized matmul entry point: GEMV for decode batches, tensor-core GEMM for prefill.

    matmul(raw, "Q4_K", x) -> y     raw uint8 (rows, row_bytes); x float32 (n,) or (tokens, n);
                                    y float32 (rows,) or (tokens, rows) on the current device
    matmul_into(w, type, x, y, rows, n, tokens, xq=None)   preallocated (runner): no allocation

Up to GEMV_MAX_TOKENS tokens use the DP4A GEMV (Q8_1 activations where the type has a DP4A
kernel, else f32 activations); more use the f16 tensor-core GEMM.
"""
from __future__ import annotations

import numpy as np

from .gemm import gemm, gemm_into
from .gemv import Q8_1_TYPES, gemv, gemv_f32_into, gemv_q8_into
from .gemv_kernels import MAX_BATCH
from .q8_1 import quantize_q8_1_into

GEMV_MAX_TOKENS = MAX_BATCH


def matmul(raw, type_name: str, x):
    """y = x @ dequantize(raw)^T choosing GEMV (<= 8 tokens) or GEMM by the token count."""
    tokens = 1 if np.ndim(x) == 1 or getattr(x, "ndim", 1) == 1 else x.shape[0]
    if tokens <= GEMV_MAX_TOKENS:
        return gemv(raw, type_name, x)
    return gemm(raw, type_name, x)


def matmul_into(w, type_name: str, x, y, rows: int, n: int, tokens: int, xq=None,
                stream=None) -> None:
    """y (tokens, rows) = x (tokens, n) @ W^T with w from gemv.weight_words. xq: a Q8_1
    workspace (tokens, n//32*36 bytes) for the DP4A GEMV; quantized here from x."""
    if tokens <= GEMV_MAX_TOKENS:
        if type_name in Q8_1_TYPES and xq is not None:
            quantize_q8_1_into(x, xq, stream=stream)
            gemv_q8_into(w, type_name, xq, y, rows, n, tokens, stream=stream)
        else:
            gemv_f32_into(w, type_name, x, y, rows, n, tokens, stream=stream)
    else:
        gemm_into(w, type_name, x, y, rows, n, tokens, stream=stream)


__all__ = ["matmul", "matmul_into", "GEMV_MAX_TOKENS"]
