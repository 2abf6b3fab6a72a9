"""The numpy backend's mixture-of-experts ops, attention sinks and YaRN angles, in float32.

Input: router scores, hidden rows and experts dequantized to float32 (n_expert, out, in)
arrays; attention scores with their sinks; RoPE parameters. Output: float32 ndarrays. Experts
run one at a time over the rows that selected them (as llama.cpp's CPU mul_mat_id groups rows
by expert). With quantized activations (NumpyBackend(quantized_activations=True)) each expert's
input is rounded the way llama.cpp's CPU backend quantizes it for the weights' type, token by
token, as `QuantActMatrix` does for the dense matrices.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from llm.backends.act_quant import round_trip
from llm.config import RopeParams

SWIGLU_OAI_ALPHA = 1.702   # gpt-oss: g * sigmoid(1.702 g) * (u + 1)
SWIGLU_OAI_LIMIT = 7.0     # g clamped above at 7, u to [-7, 7] (constants in llama.cpp)


@dataclass
class NumpyExperts:
    """Stacked experts (n_expert, out, in) float32; `act_kind` is the activation quantization
    llama.cpp applies to their inputs (act_quant.activation_kind), None for float32 inputs."""
    w: np.ndarray
    act_kind: str | None = None

    def apply(self, expert: int, x: np.ndarray) -> np.ndarray:
        """x (rows, in) @ w[expert].T -> (rows, out)."""
        if self.act_kind is None:
            return x @ self.w[expert].T
        w = self.w[expert]
        return np.stack([w @ row for row in round_trip(x, self.act_kind)])


def _softmax(x: np.ndarray) -> np.ndarray:
    out = x - x.max(axis=-1, keepdims=True)
    np.exp(out, out=out)
    out /= out.sum(axis=-1, keepdims=True)
    return out


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of each row's k largest, largest first; ties keep the lower index first."""
    return np.argsort(-scores, axis=-1, kind="stable")[:, :k]


def route(scores: np.ndarray, n_used: int, gating: str) -> tuple[np.ndarray, np.ndarray]:
    """(n, n_expert) router scores -> (ids, weights), each (n, n_used)."""
    scores = np.asarray(scores, np.float32)
    if gating == "softmax_renorm":
        probs = _softmax(scores)
        ids = _top_k(probs, n_used)
        weights = np.take_along_axis(probs, ids, axis=-1)
        weights /= weights.sum(axis=-1, keepdims=True)
    elif gating == "topk_softmax":
        ids = _top_k(scores, n_used)
        weights = _softmax(np.take_along_axis(scores, ids, axis=-1))
    else:
        raise ValueError(f"unknown MoE gating {gating!r} (softmax_renorm or topk_softmax)")
    return ids, weights


def swiglu_oai(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gpt-oss's clamped SwiGLU: g = min(g, 7), u = clamp(u, -7, 7), g*sigmoid(1.702 g)*(u+1)."""
    g = np.minimum(gate, np.float32(SWIGLU_OAI_LIMIT))
    u = np.clip(up, np.float32(-SWIGLU_OAI_LIMIT), np.float32(SWIGLU_OAI_LIMIT))
    return g / (1.0 + np.exp(np.float32(-SWIGLU_OAI_ALPHA) * g)) * (u + 1.0)


def _swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return gate / (1.0 + np.exp(-gate)) * up


ACTIVATIONS = {"swiglu": _swiglu, "swiglu_oai": swiglu_oai}


def experts(x: np.ndarray, weights, ids: np.ndarray, probs: np.ndarray,
            activation: str) -> np.ndarray:
    """x (n, n_embd) through each row's experts ids (n, k), summed with probs (n, k)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown expert activation {activation!r} "
                         f"(expected one of {', '.join(ACTIVATIONS)})")
    act = ACTIVATIONS[activation]
    out = np.zeros((x.shape[0], weights.down.w.shape[1]), np.float32)
    n_ff = weights.gate_up.w.shape[1] // 2
    for expert in np.unique(ids):
        rows, slots = np.nonzero(ids == expert)
        h = weights.gate_up.apply(expert, x[rows])
        if weights.gate_up_bias is not None:
            h += weights.gate_up_bias[expert]
        y = weights.down.apply(expert, act(h[:, :n_ff], h[:, n_ff:]))
        if weights.down_bias is not None:
            y += weights.down_bias[expert]
        out[rows] += probs[rows, slots][:, None] * y
    return out


def softmax_with_sinks(scores: np.ndarray, sinks: np.ndarray | None, n_kv: int,
                       group: int) -> None:
    """Softmax over the last axis in place; scores are (n_kv, group * n, keys) with query head
    h = kv * group + g. Head h's sink joins its softmax as one more logit (no value)."""
    view = scores.reshape(n_kv, group, -1, scores.shape[-1])
    top = view.max(axis=-1, keepdims=True)
    if sinks is not None:
        sink = np.asarray(sinks, np.float32).reshape(n_kv, group, 1, 1)
        top = np.maximum(top, sink)
    view -= top
    np.exp(view, out=view)
    total = view.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total += np.exp(sink - top)
    view /= total


def rope_angles(positions: np.ndarray, params: RopeParams,
                inv_freq: np.ndarray) -> tuple[np.ndarray, float]:
    """(angles (n, n_rot/2) float64, scale of cos and sin): plain or linearly scaled RoPE, or
    YaRN's mix of interpolated and extrapolated angles with its magnitude scale."""
    factors, scale = rope_frequency_scales(params, inv_freq.shape[0])
    return positions.astype(np.float64)[:, None] * (inv_freq * factors), scale


def rope_frequency_scales(params: RopeParams, n_pairs: int) -> tuple[np.ndarray, float]:
    """(a factor per rotated pair (n_pairs,) float64 on its frequency, the magnitude scale of
    cos and sin). Linear scaling: freq_scale everywhere. YaRN (ggml's rope_yarn and
    rope_yarn_corr_dims): the interpolated angle (x freq_scale) and the extrapolated one mix
    by a ramp over the pairs between the correction dims, i.e. a factor of
    freq_scale (1 - mix) + mix on each pair's frequency."""
    yarn = params.yarn
    if yarn is None:
        return np.full(n_pairs, params.freq_scale, np.float64), 1.0
    n_dims, base = params.n_rot, params.base

    def corr_dim(rotations: float) -> float:
        return n_dims * math.log(yarn.n_ctx_orig / (rotations * 2 * math.pi)) / (2 * math.log(base))
    low = max(0.0, math.floor(corr_dim(yarn.beta_fast)))
    high = min(n_dims - 1.0, math.ceil(corr_dim(yarn.beta_slow)))
    i = np.arange(n_pairs, dtype=np.float64)
    ramp = 1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)
    mix = ramp * yarn.ext_factor
    scale = yarn.attn_factor
    if yarn.ext_factor != 0.0:
        scale *= 1.0 + 0.1 * math.log(1.0 / params.freq_scale)
    return params.freq_scale * (1.0 - mix) + mix, scale
