"""The kernels backend's mixture-of-experts ops and YaRN RoPE factors
(qwen3moe, gpt-oss), on stdlib_kernels/moe and the backend's own launches.

Input: stacked GGUF expert tensors (uploaded once in their block format: a `DeviceExperts`
per gate|up or down, viewed by stdlib's `expert_weights`), router scores and hidden rows as
device activations, a step and its caches. Output: device activations from the backend's
arena, so a captured decode graph replays on them; routing ids and weights never leave the
device (graph-capturable).

- moe_route: stdlib's router kernel (one warp per token: top-k, softmax / renormalisation).
- moe_experts: deferred (`PendingMoe`) so that the residual add that follows it becomes the
  down projection's fused store (moe_ffn_into(res=)); up to DECODE_TOKENS tokens read only
  their experts' rows, longer steps group the (token, expert) pairs by expert on the device
  (from stdlib's GEMM_TOKENS: one int8 tensor-core GEMM launch per expert matrix).
  A quantized expert type reads Q8_1 activations (its input RMSNorm and the quantization in
  one launch), F32 / F16 / BF16 experts read f32.
- Attention with sinks is not here: KernelsBackend.attention passes them to the stdlib decode
  and prefill kernels (their `sinks` argument), like any other layer's attention.
- YaRN: its per-pair frequency mix folded into the RoPE launch's freq_factors, its magnitude
  scale as RopeSpec.mscale (numpy_moe.rope_frequency_scales is the one definition).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from llm.backends.kernels_lazy import Normed
from llm.backends.numpy_moe import rope_frequency_scales
from llm.config import RopeParams
from llm.gguf_file import TensorInfo
from stdlib_kernels.moe.experts import MoeWorkspace, expert_weights
from stdlib_kernels.moe.ffn import moe_ffn_into
from stdlib_kernels.moe.router import route_into
from stdlib_kernels.quant.gemv import Q8_1_TYPES
from stdlib_kernels.quant.q8_1 import q8_1_bytes
from stdlib_kernels.quant.rmsnorm_q8_1 import rmsnorm_q8_1_into

ROUTER_MODES = {"softmax_renorm": "softmax_norm", "topk_softmax": "topk_softmax"}
EXPERT_ACTS = {"swiglu": "silu", "swiglu_oai": "oai"}


@dataclass
class DeviceExperts:
    """Stacked experts on the device: one stdlib ExpertWeights per part (gate, up or down)."""
    parts: tuple

    @property
    def nbytes(self) -> int:
        return sum(p.words.nbytes for p in self.parts)


@dataclass
class PendingMoe:
    """moe_experts' result, not yet launched: the add that follows fuses into its store."""
    x: Any              # the FFN input: an activation, or the deferred RMSNorm (Normed)
    weights: Any        # llm.models.moe.MoeWeights of this backend's handles
    ids: Any            # (n, k) int32 on the device
    probs: Any          # (n, k) float32 on the device
    activation: str     # ArchSpec.ffn: "swiglu" or "swiglu_oai"

    @property
    def shape(self) -> tuple:
        return self.x.x.shape if isinstance(self.x, Normed) else self.x.shape


def expert_matrix(backend, parts: Sequence[TensorInfo]) -> DeviceExperts:
    """Each (n_expert, rows, n_in) GGUF tensor uploaded as it is and viewed per expert."""
    out = []
    for t in parts:
        if len(t.shape) != 3:
            raise ValueError(f"tensor {t.name!r}: expert weights must be (n_expert, rows, "
                             f"n_in), got shape {t.shape}")
        out.append(expert_weights(backend.weights.raw(t), t.ggml_type.name, t.shape[0]))
    return DeviceExperts(tuple(out))


def expert_vector(backend, parts: Sequence[TensorInfo]) -> tuple:
    """Each part's per-expert biases (n_expert, width) as a float32 device array."""
    from llm.backends.dequant import dequantize
    return tuple(backend.memory.upload(
        dequantize(t.data, t.ggml_type, t.shape).reshape(t.shape).astype(np.float32), t.name)
        for t in parts)


def moe_route(backend, scores, n_used: int, gating: str) -> tuple:
    """(ids int32, weights float32), each (n, n_used), by stdlib's router kernel."""
    if gating not in ROUTER_MODES:
        raise ValueError(f"unknown MoE gating {gating!r} (expected one of "
                         f"{', '.join(ROUTER_MODES)})")
    scores = backend.materialize(scores)
    n = scores.shape[0]
    ids = backend.arena.take((n, n_used), np.int32)
    probs = backend.arena.take((n, n_used), np.float32)
    route_into(scores, ids, probs, n_used, ROUTER_MODES[gating])
    return ids, probs


def run_experts(backend, p: PendingMoe, res=None):
    """Launch the deferred experts: y (n, n_embd) = (res +) the weighted experts' outputs,
    into res itself when given (the residual stream)."""
    if p.activation not in EXPERT_ACTS:
        raise ValueError(f"unknown expert activation {p.activation!r} "
                         f"(expected one of {', '.join(EXPERT_ACTS)})")
    w = p.weights
    gate, up = w.gate_up.parts
    (down,) = w.down.parts
    n, n_embd = p.shape
    x, xq = _expert_input(backend, p.x, gate.type_name)
    arena = backend.arena
    ws = MoeWorkspace(n, p.ids.shape[1], n_embd, gate.rows, gate.n_expert, alloc=arena.take)
    y = res if res is not None else arena.take((n, n_embd), np.float32)
    gate_bias, up_bias = w.gate_up_bias if w.gate_up_bias is not None else (None, None)
    down_bias = w.down_bias[0] if w.down_bias is not None else None
    moe_ffn_into(ws, gate, up, down, x, y, p.ids, p.probs, n, EXPERT_ACTS[p.activation],
                 gate_bias, up_bias, down_bias, res=res, xq=xq)
    return y


def _expert_input(backend, x, type_name: str) -> tuple:
    """(f32 rows, Q8_1 rows or None) of the experts' input: a deferred RMSNorm feeding Q8_1
    experts is normalised and quantized in one launch (the f32 rows, then unwritten, only
    give the shape: the kernels read xq alone)."""
    if isinstance(x, Normed) and type_name in Q8_1_TYPES and x.x.shape[-1] % 32 == 0:
        n, n_embd = x.x.shape
        xq = backend.arena.take((n, q8_1_bytes(n_embd)), np.uint8)
        rmsnorm_q8_1_into(x.x, x.weight, x.eps, xq)
        return x.x, xq
    return backend.materialize(x), None


# --- YaRN --------------------------------------------------------------------------------
def rope_freq_factors(backend, params: RopeParams, freq_factors):
    """The RoPE launch's freq_factors for params: the file's (rope_freqs, or None) where the
    frequencies are unscaled; else those divided by the per-pair scale (linear or YaRN),
    uploaded once per (params, file factors) and kept (a graph replays on them)."""
    if params.yarn is None and params.freq_scale == 1.0:
        return freq_factors
    key = (params, id(freq_factors))
    if key not in backend.rope_tables:
        half = params.n_rot // 2
        scales, _ = rope_frequency_scales(params, half)
        base = np.ones(half) if freq_factors is None else \
            np.asarray(backend.to_host(freq_factors), np.float64).reshape(-1)[:half]
        table = backend.memory.upload((base / scales).astype(np.float32), "rope_freq_factors")
        backend.rope_tables[key] = (table, freq_factors)   # the key's factors stay alive
    return backend.rope_tables[key][0]


def rope_mscale(params: RopeParams) -> float:
    """YaRN's magnitude scale of cos and sin (1 without YaRN)."""
    return 1.0 if params.yarn is None else rope_frequency_scales(params, 0)[1]
