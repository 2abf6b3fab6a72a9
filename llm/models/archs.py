"""Per-architecture hooks: how llama, qwen2, qwen3, gemma3 and gpt2 differ from one another.

Input: an architecture name. Output: an `ArchSpec`, the handful of switches the one transformer
in `transformer.py` reads (norm kind, FFN kind, fused QKV, q/k norm, post-norms, learned
positions). Shapes and RoPE parameters come from `ModelConfig`; optional biases are used when
the file has them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchSpec:
    norm: str                  # "rms" or "layer" (LayerNorm with bias)
    ffn: str                   # "swiglu" (silu(gate)*up), "geglu_tanh", "gelu" (up -> gelu)
    fused_qkv: bool = False    # one attn_qkv tensor instead of attn_q/attn_k/attn_v
    qk_norm: bool = False      # per-head RMSNorm of q and k before RoPE
    post_norms: bool = False   # RMSNorm of the attention / FFN output before the residual add
    learned_positions: bool = False  # position_embd added to the token embeddings


ARCH_SPECS = {
    "llama": ArchSpec(norm="rms", ffn="swiglu"),
    "qwen2": ArchSpec(norm="rms", ffn="swiglu"),
    "qwen3": ArchSpec(norm="rms", ffn="swiglu", qk_norm=True),
    "gemma3": ArchSpec(norm="rms", ffn="geglu_tanh", qk_norm=True, post_norms=True),
    "gpt2": ArchSpec(norm="layer", ffn="gelu", fused_qkv=True, learned_positions=True),
}
