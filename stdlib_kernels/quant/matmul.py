"""Quantized matmul entry point: GEMV for decode batches, tensor-core GEMM for prefill.

    matmul(raw, "Q4_K", x) -> y     raw uint8 (rows, row_bytes); x float32 (n,) or (tokens, n);
                                    y float32 (rows,) or (tokens, rows) on the current device
    matmul_into(w, type, x, y, rows, n, tokens, xq=None)   preallocated (runner): no allocation

Up to GEMV_MAX_TOKENS tokens use the DP4A GEMV (Q8_1 activations where the type has a DP4A
kernel, else f32 activations), except that the int8 GEMM's types take it from INT8_GEMM_TOKENS
(the GEMV decodes each weight block once per token, so its time grows with the tokens; the
GEMM's 64 x 8 tiles are faster from 6). Q4_K and Q6_K take the tensor-core GEMV (gemv_mma.py,
mma_gemv_applies: 5-16 tokens, no shared-memory stages) instead of either. More tokens use a
tensor-core GEMM: the int8 one (gemm_q8.py, Q8_1 activations; Q4_K / Q6_K through
gemm_q8_k.py) for the types in
INT8_PREFILL_TYPES, where it measured faster than the f16 one (benchmarks/RESULTS.md), when a
Q8_1 workspace xq is given; else the f16 GEMM (gemm.py).
"""
from __future__ import annotations

import numpy as np

from .formats import GEMM_Q8, type_ids
from .gemm import gemm, gemm_into
from .gemm_q8 import gemm_q8, gemm_q8_into
from .gemv import Q8_1_TYPES, gemv, gemv_f32_into, gemv_q8_into
from .gemv_kernels import MAX_BATCH
from .gemv_mma import gemv_mma, gemv_mma_into, mma_gemv_applies
from .q8_1 import quantize_q8_1_into

GEMV_MAX_TOKENS = MAX_BATCH
# H100, llama-8B Q4_K_M's matmuls (benchmarks/RESULTS.md "Batched decode GEMVs"): at 8 tokens
# gate|up 64.6 us on the GEMV, 46.2 on the GEMM; a batched decode step of 5 sequences 5.68 ms
# with the GEMV, 5.78 with the GEMM; 6: 7.06 -> 6.10
INT8_GEMM_TOKENS = 6
# int8 GEMM faster than f16 on the H200 at m=4096 n=512 k=14336 (benchmarks/RESULTS.md:
# Q4_0 701 vs 1064 us, Q8_0 517 vs 1093 us, Q4_K 442 vs 1132 us, Q6_K 494 vs 1069 us)
INT8_PREFILL_TYPES = frozenset(type_ids(GEMM_Q8))


def prefill_path(type_name: str, n: int, xq=None) -> str:
    """"int8" or "f16": the GEMM that matmul / matmul_into use for more than 8 tokens."""
    if type_name in INT8_PREFILL_TYPES and n % 32 == 0 and xq is not None:
        return "int8"
    return "f16"


def uses_gemm(type_name: str, n: int, tokens: int, xq=None) -> bool:
    """Whether `tokens` rows of x leave the DP4A GEMV: above GEMV_MAX_TOKENS, or where the
    int8 kernels apply (prefill_path) from INT8_GEMM_TOKENS, or within the tensor-core GEMV's
    range (mma_gemv_applies), which then runs instead of the int8 GEMM."""
    return tokens > GEMV_MAX_TOKENS or prefill_path(type_name, n, xq) == "int8" and (
        tokens >= INT8_GEMM_TOKENS or mma_gemv_applies(type_name, tokens))


def matmul(raw, type_name: str, x):
    """y = x @ dequantize(raw)^T choosing GEMV or GEMM by the token count (uses_gemm)."""
    tokens = 1 if np.ndim(x) == 1 or getattr(x, "ndim", 1) == 1 else x.shape[0]
    if not uses_gemm(type_name, x.shape[-1], tokens, xq=True):
        return gemv(raw, type_name, x)
    if prefill_path(type_name, x.shape[1], xq=True) == "int8":
        if mma_gemv_applies(type_name, tokens):
            return gemv_mma(raw, type_name, x)
        return gemm_q8(raw, type_name, x)
    return gemm(raw, type_name, x)


def matmul_into(w, type_name: str, x, y, rows: int, n: int, tokens: int, xq=None,
                stream=None) -> None:
    """y (tokens, rows) = x (tokens, n) @ W^T with w from gemv.weight_words. xq: a Q8_1
    workspace (tokens, n//32*36 bytes) for the DP4A GEMV and the int8 GEMM; quantized here."""
    if not uses_gemm(type_name, n, tokens, xq):
        if type_name in Q8_1_TYPES and xq is not None:
            quantize_q8_1_into(x, xq, stream=stream)
            gemv_q8_into(w, type_name, xq, y, rows, n, tokens, stream=stream)
        else:
            gemv_f32_into(w, type_name, x, y, rows, n, tokens, stream=stream)
    elif prefill_path(type_name, n, xq) == "int8":
        quantize_q8_1_into(x, xq, stream=stream)
        if mma_gemv_applies(type_name, tokens):
            gemv_mma_into(w, type_name, xq, y, rows, n, tokens, stream=stream)
        else:
            gemm_q8_into(w, type_name, xq, y, rows, n, tokens, stream=stream)
    else:
        gemm_into(w, type_name, x, y, rows, n, tokens, stream=stream)


__all__ = ["matmul", "matmul_into", "prefill_path", "uses_gemm", "GEMV_MAX_TOKENS",
           "INT8_GEMM_TOKENS", "INT8_PREFILL_TYPES"]
