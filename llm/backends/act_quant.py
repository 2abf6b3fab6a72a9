"""Emulation of llama.cpp's CPU activation quantization: float32 rows -> the float32 values the
quantized activations stand for.

llama.cpp's CPU matmul quantizes the activations to the weight type's "vec_dot_type" before the
dot products: Q8_0 for Q4_0/Q5_0/Q8_0/MXFP4 weights, Q8_1 (same values) for Q4_1/Q5_1, Q8_K for the
K-quants, f16 for F16 weights. Feeding `round_trip(x, kind)` to an f32 matmul of the dequantized
weights reproduces its logits to ~1e-6 (tiny Q8_0 model), which lets the numpy backend stand in
for llama.cpp's quantized path. The default (kind None) keeps float32 activations.
"""
from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType as Q

# MXFP4's CPU dot product also takes Q8_0 activations (ggml-cpu's vec_dot_type for it)
Q8_0_WEIGHTS = {Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.Q4_1, Q.Q5_1} | (
    {Q.MXFP4} if "MXFP4" in Q.__members__ else set())
Q8_K_WEIGHTS = {Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K}


def activation_kind(weight_type: Q) -> str | None:
    """Which quantization llama.cpp's CPU backend applies to activations for this weight type."""
    if weight_type in Q8_0_WEIGHTS:
        return "q8_0"
    if weight_type in Q8_K_WEIGHTS:
        return "q8_k"
    if weight_type == Q.F16:
        return "f16"
    return None


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """C roundf: halves away from zero."""
    return np.trunc(x + np.copysign(np.float32(0.5), x))


def _q8_0(x: np.ndarray) -> np.ndarray:
    # blocks of 32: d = amax/127 (stored as f16), q = roundf(x / d)
    blocks = x.reshape(x.shape[0], -1, 32)
    d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    q = _round_half_away(blocks * inv)
    return (q * d.astype(np.float16).astype(np.float32)).reshape(x.shape)


def _q8_k(x: np.ndarray) -> np.ndarray:
    # blocks of 256: scale from the signed value of largest magnitude, q = nearest(x * -127/max)
    blocks = x.reshape(x.shape[0], -1, 256)
    idx = np.abs(blocks).argmax(axis=-1)[..., None]
    signed_max = np.take_along_axis(blocks, idx, axis=-1)
    iscale = np.divide(np.float32(-127), signed_max, out=np.zeros_like(signed_max),
                       where=signed_max != 0)
    q = np.minimum(np.rint(blocks * iscale), 127)  # nearest_int rounds half to even
    d = np.divide(np.float32(1), iscale, out=np.zeros_like(iscale), where=iscale != 0)
    return (q * d).reshape(x.shape)


def round_trip(x: np.ndarray, kind: str | None) -> np.ndarray:
    """x (n, k) float32 -> the float32 values of x quantized as `kind` and dequantized."""
    if kind is None:
        return x
    if kind == "f16":
        return x.astype(np.float16).astype(np.float32)
    x = np.ascontiguousarray(x, dtype=np.float32)
    return _q8_0(x) if kind == "q8_0" else _q8_k(x)
