"""Per-architecture hooks: how llama, qwen2, qwen3, gemma3, gpt2, qwen3moe and gpt-oss differ.

Input: an architecture name. Output: an `ArchSpec`, the handful of switches the one transformer
in `transformer.py` reads (norm kind, FFN kind, fused QKV, q/k norm, post-norms, learned
positions, mixture-of-experts routing, attention sinks). Shapes and RoPE parameters come from `ModelConfig`; optional biases are used when
the file has them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchSpec:
    norm: str                  # "rms" or "layer" (LayerNorm with bias)
    ffn: str                   # "swiglu" (silu(gate)*up), "geglu_tanh", "gelu" (up -> gelu),
    #                            "swiglu_oai" (gpt-oss's clamped variant; experts only)
    fused_qkv: bool = False    # one attn_qkv tensor instead of attn_q/attn_k/attn_v
    qk_norm: bool = False      # per-head RMSNorm of q and k before RoPE
    post_norms: bool = False   # RMSNorm of the attention / FFN output before the residual add
    learned_positions: bool = False  # position_embd added to the token embeddings
    # mixture of experts ("": a dense FFN): how the router's logits become k expert weights,
    # "softmax_renorm" (softmax over all, top-k, renormalised to sum 1: qwen3moe) or
    # "topk_softmax" (top-k of the raw logits, softmax over those k: gpt-oss)
    moe_gating: str = ""
    attn_sinks: bool = False   # a learned logit per head joins each softmax (attn_sinks)
    ffn_norm: str = "ffn_norm"  # the tensor that normalises the FFN's input


MOE_GATINGS = ("softmax_renorm", "topk_softmax")


ARCH_SPECS = {
    "llama": ArchSpec(norm="rms", ffn="swiglu"),
    "qwen2": ArchSpec(norm="rms", ffn="swiglu"),
    "qwen3": ArchSpec(norm="rms", ffn="swiglu", qk_norm=True),
    "gemma3": ArchSpec(norm="rms", ffn="geglu_tanh", qk_norm=True, post_norms=True),
    "gpt2": ArchSpec(norm="layer", ffn="gelu", fused_qkv=True, learned_positions=True),
    "qwen3moe": ArchSpec(norm="rms", ffn="swiglu", qk_norm=True, moe_gating="softmax_renorm"),
    "gpt-oss": ArchSpec(norm="rms", ffn="swiglu_oai", moe_gating="topk_softmax",
                        attn_sinks=True, ffn_norm="post_attention_norm"),
}


def model_features(cfg, spec: ArchSpec) -> frozenset:
    """What a model needs of a backend beyond a dense transformer (Backend.model_features)."""
    rope = cfg.rope
    return frozenset(name for name, needed in (
        ("moe", bool(spec.moe_gating)), ("attn_sinks", spec.attn_sinks),
        ("yarn", rope is not None and rope.yarn is not None)) if needed)
