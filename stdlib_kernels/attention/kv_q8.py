"""Q8_0 KV caches for decode attention: ggml's block_q8_0 (an f16 scale and 32 int8 quants per
32 values) split in two arrays, so the quants of a row stay 16-byte aligned for vector loads.

    cache = quantize_kv(k)            k (..., max_len, D) float, D % 32 == 0 -> Q8Cache
    dequantize_kv(cache) -> float32   (the values attention sees; for references)

Quantization is ggml's reference Q8_0 (stdlib_kernels.quant.reference), bit-exact.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import pykernel as pk
from ..quant import reference as ref

BLOCK = 32
DTYPE = "q8_0"


@dataclass(frozen=True)
class Q8Cache:
    """quants (..., max_len, D) int8 and scales (..., max_len, D / 32) float16 on a device."""
    quants: pk.Array
    scales: pk.Array

    def __post_init__(self):
        q, d = self.quants, self.scales
        if q.dtype != np.int8 or d.dtype != np.float16 or q.shape[-1] % BLOCK or \
                d.shape != q.shape[:-1] + (q.shape[-1] // BLOCK,):
            raise ValueError(f"Q8Cache: quants (..., D) int8 and scales (..., D / 32) float16 "
                             f"expected, got {q.shape} {q.dtype} and {d.shape} {d.dtype}")

    shape = property(lambda self: self.quants.shape)
    ndim = property(lambda self: self.quants.ndim)
    dtype = property(lambda self: DTYPE)


def quantize_kv(x, device=None) -> Q8Cache:
    """A float array (..., D) -> its Q8_0 cache on `device` (default: the current one)."""
    x = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    if x.ndim < 2 or x.shape[-1] % BLOCK:
        raise ValueError(f"quantize_kv: expected (..., D) with D a multiple of {BLOCK}, got "
                         f"{x.shape}")
    blocks = ref.quantize(x.reshape(-1, x.shape[-1]), "Q8_0").reshape(-1, 2 + BLOCK)
    scales = blocks[:, :2].copy().view(np.float16).reshape(x.shape[:-1] + (-1,))
    quants = blocks[:, 2:].copy().view(np.int8).reshape(x.shape)
    return Q8Cache(pk.to_device(quants, device=device), pk.to_device(scales, device=device))


def dequantize_kv(cache: Q8Cache) -> np.ndarray:
    q = cache.quants.numpy().astype(np.float32)
    d = cache.scales.numpy().astype(np.float32)
    return (q.reshape(d.shape + (BLOCK,)) * d[..., None]).reshape(q.shape)
