"""Deferred activations of the kernels backend: how ops that the model code calls one at a time
end up as fused launches.

Input: what an op returns before its consumer is known. Output: the consumer either fuses it
(attention takes `Roped` q/k -> one RoPE + KV-cache write launch; `add` takes a `PendingMatmul` ->
the residual add in the GEMV's epilogue; `swiglu` takes two `GluHalf` -> gate/up GEMV with SwiGLU
in its epilogue; `matmul` takes a `Normed` -> RMSNorm and the Q8_1 quantization its GEMV reads in
one launch, or a `Quantized` -> no quantize launch; attention takes `Roped` of `HeadNormed` q/k
-> qwen3 / gemma3's per-head q/k norms in the same RoPE launch) or calls `materialize` for a
plain contiguous device array.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm.config import RopeParams


@dataclass
class Cols:
    """Columns [off, off + width) of a row-major (n, total) array with n > 1 (not contiguous)."""
    src: Any
    off: int
    width: int


@dataclass
class Roped:
    """x (n, heads * head_dim) to be rotated by RoPE at `positions` (the step's: device, or
    host ints)."""
    x: Any
    head_dim: int
    params: RopeParams
    freq_factors: Any
    positions: Any


@dataclass
class Normed:
    """RMSNorm(x) * weight (rows of x), not yet launched."""
    x: Any
    weight: Any
    eps: float


@dataclass
class HeadNormed:
    """RMSNorm of each `group`-wide head of x times weight (group,), not yet launched."""
    x: Any
    weight: Any
    eps: float
    group: int


@dataclass
class Quantized:
    """A finished activation x with its Q8_1 copy xq already made (decode attention's combine
    kernel writes both), so a GEMV reading Q8_1 needs no quantize launch."""
    x: Any
    xq: Any


@dataclass
class PendingMatmul:
    """x @ w.T (+ bias), not yet launched. xq: x already quantized to Q8_1 (by the fused
    RMSNorm), or None."""
    x: Any
    w: Any
    bias: Any
    xq: Any = None


@dataclass
class PendingGlu:
    """x @ [gate; up].T whose halves only feed a gated activation."""
    x: Any
    w: Any
    xq: Any = None


@dataclass
class GluHalf:
    pending: PendingGlu
    index: int  # 0: gate, 1: up
