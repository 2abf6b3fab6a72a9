"""GGUF tensors -> backend weight handles, by name, with every shape checked against the config.

Input: `GGUFFile`, `ModelConfig`, `ArchSpec`, a `Backend`. Output: `ModelWeights` (embedding,
output norm and projection, and one `LayerWeights` per block). A tensor that is missing or has
the wrong shape or a type no backend can use as a weight (F64, integer types) is a `GGUFError`
naming it and what was expected, found by a first pass that checks every tensor before any is
dequantized or uploaded. Fused projections (q|k|v, gate|up) are stacked into one matrix so each
takes one matmul. Mixture-of-experts layers hold `MoeWeights` (router and stacked experts,
`llm/models/moe.py`) instead of the dense FFN matrices; gpt-oss layers add `attn_sinks`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm.backends.base import Backend
from llm.backends.dequant import WEIGHT_TYPES
from llm.config import ModelConfig
from llm.gguf_file import GGUFError, GGUFFile, TensorInfo
from llm.models.archs import ArchSpec
from llm.models.moe import MoeWeights, load_moe_weights


@dataclass
class Norm:
    weight: Any
    bias: Any = None


@dataclass
class LayerWeights:
    attn_norm: Norm
    qkv: Any                     # (q + k + v rows, n_embd)
    qkv_bias: Any
    q_norm: Any
    k_norm: Any
    attn_out: Any
    attn_out_bias: Any
    post_attn_norm: Norm | None
    ffn_norm: Norm
    gate_up: Any                 # (2 * n_ff, n_embd) for gated FFNs, (n_ff, n_embd) for gpt2
    gate_up_bias: Any
    down: Any
    down_bias: Any
    post_ffw_norm: Norm | None
    moe: MoeWeights | None = None   # a mixture-of-experts FFN (gate_up, down are then None)
    attn_sinks: Any = None          # (n_head,) learned sink logits (gpt-oss)


@dataclass
class ModelWeights:
    token_embd: Any
    position_embd: Any
    output_norm: Norm
    output: Any
    rope_freqs: Any
    layers: list[LayerWeights]


def _usable(g: GGUFFile, t: TensorInfo) -> TensorInfo:
    if t.ggml_type not in WEIGHT_TYPES:
        known = ", ".join(sorted(w.name for w in WEIGHT_TYPES))
        raise GGUFError(g.path, f"tensor {t.name!r}", f"type {t.ggml_type.name} cannot be used "
                        f"as a weight (expected one of {known})")
    return t


class _ChecksOnly:
    """A backend that builds nothing: load_weights runs through it first so that a missing,
    misshapen or unusable tensor fails before any work on the others."""

    def matrix(self, parts):
        return None

    vector = expert_matrix = expert_vector = matrix

    def embedding(self, table):
        return None


class _Source:
    """Looks tensors up by name and checks their numpy-order shapes."""

    def __init__(self, g: GGUFFile, backend: Backend):
        self.g, self.backend = g, backend

    def take(self, name: str, shape: tuple[int, ...]) -> TensorInfo:
        t = self.g.tensor(name)
        if tuple(t.shape) != tuple(shape):
            raise GGUFError(self.g.path, f"tensor {name!r}", f"expected shape {tuple(shape)} "
                            f"(numpy order), got {tuple(t.shape)}")
        return _usable(self.g, t)

    def optional(self, name: str, shape: tuple[int, ...]) -> TensorInfo | None:
        return self.take(name, shape) if name in self.g.tensors else None

    def matrix(self, *parts):
        return self.backend.matrix([self.take(n, s) for n, s in parts])

    def vector(self, *parts):
        return self.backend.vector([self.take(n, s) for n, s in parts])

    def optional_vector(self, *parts):
        present = [n in self.g.tensors for n, _ in parts]
        if not any(present):
            return None
        return self.vector(*parts)  # all or nothing: a missing one is reported by take()

    def experts(self, *parts):
        return self.backend.expert_matrix([self.take(n, s) for n, s in parts])

    def optional_expert_vector(self, *parts):
        if not any(n in self.g.tensors for n, _ in parts):
            return None
        return self.backend.expert_vector([self.take(n, s) for n, s in parts])

    def norm(self, prefix: str, width: int, with_bias: bool) -> Norm:
        bias = self.vector((f"{prefix}.bias", (width,))) if with_bias else None
        return Norm(self.vector((f"{prefix}.weight", (width,))), bias)


def _attention_weights(src: _Source, cfg: ModelConfig, spec: ArchSpec, p: str) -> dict:
    q_rows, k_rows = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    v_rows, e = cfg.n_head_kv * cfg.head_dim_v, cfg.n_embd
    if spec.fused_qkv:
        qkv = src.matrix((f"{p}.attn_qkv.weight", (q_rows + k_rows + v_rows, e)))
        qkv_bias = src.optional_vector((f"{p}.attn_qkv.bias", (q_rows + k_rows + v_rows,)))
    else:
        qkv = src.matrix((f"{p}.attn_q.weight", (q_rows, e)), (f"{p}.attn_k.weight", (k_rows, e)),
                         (f"{p}.attn_v.weight", (v_rows, e)))
        qkv_bias = src.optional_vector((f"{p}.attn_q.bias", (q_rows,)),
                                       (f"{p}.attn_k.bias", (k_rows,)),
                                       (f"{p}.attn_v.bias", (v_rows,)))
    qk = spec.qk_norm
    return dict(
        qkv=qkv, qkv_bias=qkv_bias,
        q_norm=src.vector((f"{p}.attn_q_norm.weight", (cfg.head_dim,))) if qk else None,
        k_norm=src.vector((f"{p}.attn_k_norm.weight", (cfg.head_dim,))) if qk else None,
        attn_out=src.matrix((f"{p}.attn_output.weight", (e, cfg.n_head * cfg.head_dim_v))),
        attn_out_bias=src.optional_vector((f"{p}.attn_output.bias", (e,))),
    )


def _ffn_weights(src: _Source, cfg: ModelConfig, spec: ArchSpec, p: str) -> dict:
    e, f = cfg.n_embd, cfg.n_ff
    if spec.moe_gating:
        return dict(gate_up=None, gate_up_bias=None, down=None, down_bias=None,
                    moe=load_moe_weights(src, cfg, p))
    if spec.ffn == "gelu":
        gate_up = src.matrix((f"{p}.ffn_up.weight", (f, e)))
        gate_up_bias = src.optional_vector((f"{p}.ffn_up.bias", (f,)))
    else:
        gate_up = src.matrix((f"{p}.ffn_gate.weight", (f, e)), (f"{p}.ffn_up.weight", (f, e)))
        gate_up_bias = None
    return dict(gate_up=gate_up, gate_up_bias=gate_up_bias,
                down=src.matrix((f"{p}.ffn_down.weight", (e, f))),
                down_bias=src.optional_vector((f"{p}.ffn_down.bias", (e,))))


def _layer(src: _Source, cfg: ModelConfig, spec: ArchSpec, il: int) -> LayerWeights:
    p, e, biased = f"blk.{il}", cfg.n_embd, spec.norm == "layer"
    post = spec.post_norms
    return LayerWeights(
        attn_norm=src.norm(f"{p}.attn_norm", e, biased),
        post_attn_norm=src.norm(f"{p}.post_attention_norm", e, False) if post else None,
        ffn_norm=src.norm(f"{p}.{spec.ffn_norm}", e, biased),
        post_ffw_norm=src.norm(f"{p}.post_ffw_norm", e, False) if post else None,
        **_attention_weights(src, cfg, spec, p), **_ffn_weights(src, cfg, spec, p),
        attn_sinks=src.vector((f"{p}.attn_sinks.weight", (cfg.n_head,)))
        if spec.attn_sinks else None,
    )


def load_weights(g: GGUFFile, cfg: ModelConfig, spec: ArchSpec, backend: Backend) -> ModelWeights:
    _build(g, cfg, spec, _ChecksOnly())   # every tensor checked before any is loaded
    return _build(g, cfg, spec, backend)


def _build(g: GGUFFile, cfg: ModelConfig, spec: ArchSpec, backend) -> ModelWeights:
    src = _Source(g, backend)
    embd = src.take("token_embd.weight", (cfg.n_vocab, cfg.n_embd))
    output = src.optional("output.weight", (cfg.n_vocab, cfg.n_embd)) or embd  # tied if absent
    positions = None
    if spec.learned_positions:
        table = _usable(g, g.tensor("position_embd.weight"))
        if table.shape[1:] != (cfg.n_embd,) or table.shape[0] < cfg.n_ctx_train:
            raise GGUFError(g.path, "tensor 'position_embd.weight'", f"expected shape "
                            f"({cfg.n_ctx_train}, {cfg.n_embd}), got {table.shape}")
        positions = backend.embedding(table)
    rope_freqs = None
    if cfg.rope is not None and "rope_freqs.weight" in g.tensors:
        rope_freqs = backend.vector([src.take("rope_freqs.weight", (cfg.rope.n_rot // 2,))])
    return ModelWeights(
        token_embd=backend.embedding(embd), position_embd=positions,
        output_norm=src.norm("output_norm", cfg.n_embd, spec.norm == "layer"),
        output=backend.matrix([output]), rope_freqs=rope_freqs,
        layers=[_layer(src, cfg, spec, il) for il in range(cfg.n_layer)],
    )
