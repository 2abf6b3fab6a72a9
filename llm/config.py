"""GGUF metadata -> `ModelConfig`: the hyperparameters of one model, per architecture.

Input: a `GGUFFile`. Output: a frozen dataclass with the shapes, RoPE and normalization
parameters the forward pass needs. Keys are `{arch}.*` as llama.cpp writes them; an absent
required key, an unsupported architecture, a float that is not finite and positive (norm epsilon,
RoPE base) or a count the tensors contradict (block_count, embedding_length, vocab size) is a
`GGUFError` naming the key. Mixture-of-experts architectures add `MoeParams` (expert counts and
width); gpt-oss adds sliding-window layers and YaRN RoPE scaling (`rope.scaling.*`). Counts are checked against the tensor table before anything
proportional to them is built, so a header cannot make the loader allocate without bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from llm.gguf_file import GGUFError, GGUFFile

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3", "gpt2", "qwen3moe", "gpt-oss")
MOE_ARCHITECTURES = ("qwen3moe", "gpt-oss")
GEMMA3_SLIDING_ROPE_BASE = 10000.0
GEMMA3_SLIDING_PERIOD = 6   # layers il with il % 6 < 5 use the sliding window
GPT_OSS_SLIDING_PERIOD = 2  # layers il with il % 2 == 0 use the sliding window
ROPE_SCALING_TYPES = ("none", "linear", "yarn")


@dataclass(frozen=True)
class YarnParams:
    """YaRN RoPE scaling (ggml's rope_yarn): each dim's angle mixes the interpolated angle
    (position * freq_scale) and the extrapolated one by a ramp over the dims between the
    correction dims that beta_fast / beta_slow rotations at n_ctx_orig positions give; cos and
    sin are scaled by attn_factor * (1 + 0.1 ln(1 / freq_scale))."""
    n_ctx_orig: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    ext_factor: float = 1.0
    attn_factor: float = 1.0


@dataclass(frozen=True)
class RopeParams:
    """Rotary embedding of the first `n_rot` dims of each head; `neox` pairs i with i + n_rot/2,
    otherwise adjacent pairs (2i, 2i+1)."""
    n_rot: int
    base: float
    neox: bool
    freq_scale: float = 1.0          # linear scaling: positions multiplied by this
    yarn: YarnParams | None = None   # YaRN scaling (freq_scale is then 1 / factor)


@dataclass(frozen=True)
class MoeParams:
    """A mixture-of-experts FFN: each token runs `n_expert_used` of `n_expert` experts, each a
    gated FFN of width `n_ff_exp`."""
    n_expert: int
    n_expert_used: int
    n_ff_exp: int


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int                    # key/query head size
    head_dim_v: int                  # value head size
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    eps: float                       # RMSNorm or LayerNorm epsilon
    rope: RopeParams | None          # None: learned absolute positions (gpt2)
    rope_local: RopeParams | None = None   # sliding-window layers' RoPE (gemma3)
    attn_scale: float = 0.0          # multiplies q.k; 1/sqrt(head_dim) unless the model says
    sliding_window: int = 0          # 0: none
    sliding_layers: tuple[bool, ...] = field(default=())
    embed_scale: float = 1.0         # token embeddings multiplied by this (gemma3: sqrt(n_embd))
    moe: MoeParams | None = None     # None: a dense FFN of width n_ff

    def layer_rope(self, layer: int) -> RopeParams | None:
        if self.sliding_layers and self.sliding_layers[layer] and self.rope_local is not None:
            return self.rope_local
        return self.rope

    def layer_window(self, layer: int) -> int:
        return self.sliding_window if self.sliding_layers and self.sliding_layers[layer] else 0

    @property
    def kv_bytes_per_token(self) -> int:
        """float32 K and V for every layer."""
        return 4 * self.n_layer * self.n_head_kv * (self.head_dim + self.head_dim_v)


def _positive(g: GGUFFile, key: str, default=None) -> int:
    value = g.require(key, int) if default is None else g.get(key, default, int)
    if value <= 0:
        raise GGUFError(g.path, f"key {key!r}", f"expected a positive integer, got {value}")
    return value


def _positive_float(g: GGUFFile, key: str, default=None) -> float:
    """A finite float > 0 (NaN, Inf, 0 or a negative epsilon or RoPE base would make every
    logit NaN at run time)."""
    value = g.require(key, float) if default is None else g.get(key, default, float)
    if not (math.isfinite(value) and value > 0):
        raise GGUFError(g.path, f"key {key!r}", f"expected a finite number > 0, got {value!r}")
    return value


def _check_block_count(g: GGUFFile, arch: str, n_layer: int) -> None:
    """Every block 0..n_layer-1 has tensors in the file (checked before any per-layer table;
    the loop is bounded by the tensor count, not by the header's number)."""
    blocks = {name.split(".")[1] for name in g.tensors if name.startswith("blk.")}
    missing = next(il for il in range(len(blocks) + 1) if str(il) not in blocks)
    if missing < n_layer:
        raise GGUFError(g.path, f"key '{arch}.block_count'", f"{n_layer} blocks, but the file "
                        f"has no tensors for block {missing} (expected blk.0 to "
                        f"blk.{n_layer - 1})")


def _check_embedding(g: GGUFFile, arch: str, n_vocab: int, n_embd: int) -> None:
    """The token embedding table is (n_vocab, n_embd) and the tokenizer has no more tokens."""
    shape = g.tensor("token_embd.weight").shape
    if len(shape) != 2 or shape[1] != n_embd:
        raise GGUFError(g.path, f"key '{arch}.embedding_length'", f"{n_embd} does not match "
                        f"tensor 'token_embd.weight' of shape {shape} (n_vocab, n_embd)")
    if shape[0] != n_vocab:
        raise GGUFError(g.path, "tensor 'token_embd.weight'", f"expected {n_vocab} rows (the "
                        f"vocabulary size), got shape {shape}")
    tokens = g.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and len(tokens) > n_vocab:
        raise GGUFError(g.path, "key 'tokenizer.ggml.tokens'", f"{len(tokens)} tokens, but the "
                        f"model has {n_vocab} embedding rows (expected at most as many)")


def _n_vocab(g: GGUFFile, arch: str) -> int:
    if f"{arch}.vocab_size" in g.metadata:
        return _positive(g, f"{arch}.vocab_size")
    tokens = g.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and tokens:
        return len(tokens)
    return g.tensor("token_embd.weight").shape[0]


def _rope(g: GGUFFile, arch: str, head_dim: int, neox: bool) -> RopeParams:
    n_rot = _positive(g, f"{arch}.rope.dimension_count", head_dim)
    if n_rot > head_dim or n_rot % 2:
        raise GGUFError(g.path, f"key '{arch}.rope.dimension_count'",
                        f"expected an even number <= head size {head_dim}, got {n_rot}")
    base = _positive_float(g, f"{arch}.rope.freq_base", 10000.0)
    scaling_type = g.get(f"{arch}.rope.scaling.type", "none", str)
    if scaling_type not in ROPE_SCALING_TYPES:
        raise GGUFError(g.path, f"key '{arch}.rope.scaling.type'", f"RoPE scaling "
                        f"{scaling_type!r} is not supported ({', '.join(ROPE_SCALING_TYPES)})")
    factor = g.get(f"{arch}.rope.scaling.factor", 0.0, float)
    if not (math.isfinite(factor) and factor >= 0):
        raise GGUFError(g.path, f"key '{arch}.rope.scaling.factor'",
                        f"expected a finite number >= 0, got {factor!r}")
    scale = 1.0 / factor if scaling_type != "none" and factor > 0 else 1.0
    yarn = _yarn(g, arch) if scaling_type == "yarn" else None
    return RopeParams(n_rot=n_rot, base=base, neox=neox, freq_scale=scale, yarn=yarn)


def _yarn(g: GGUFFile, arch: str) -> YarnParams:
    key = f"{arch}.rope.scaling"
    return YarnParams(
        n_ctx_orig=_positive(g, f"{key}.original_context_length",
                             _positive(g, f"{arch}.context_length")),
        beta_fast=_positive_float(g, f"{key}.yarn_beta_fast", 32.0),
        beta_slow=_positive_float(g, f"{key}.yarn_beta_slow", 1.0),
        attn_factor=_positive_float(g, f"{key}.attn_factor", 1.0))


def _moe(g: GGUFFile, arch: str) -> MoeParams:
    n_expert = _positive(g, f"{arch}.expert_count")
    n_used = _positive(g, f"{arch}.expert_used_count")
    if n_used > n_expert:
        raise GGUFError(g.path, f"key '{arch}.expert_used_count'", f"expected at most "
                        f"expert_count {n_expert}, got {n_used}")
    return MoeParams(n_expert=n_expert, n_expert_used=n_used,
                     n_ff_exp=_positive(g, f"{arch}.expert_feed_forward_length"))


def _sliding(g: GGUFFile, arch: str, n_layer: int, period: int) -> dict:
    """gemma3 (period 6): layers il % 6 < 5 slide; gpt-oss (period 2): layers il % 2 == 0."""
    sliding = tuple(il % period < period - 1 for il in range(n_layer))
    return dict(sliding_window=_positive(g, f"{arch}.attention.sliding_window"),
                sliding_layers=sliding)


def load_config(g: GGUFFile) -> ModelConfig:
    """Hyperparameters of the model in `g`; GGUFError for unsupported or incomplete files."""
    arch = g.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(g.path, "key 'general.architecture'", f"architecture {arch!r} is not "
                        f"supported (expected one of {', '.join(SUPPORTED_ARCHITECTURES)})")
    n_embd = _positive(g, f"{arch}.embedding_length")
    n_layer = _positive(g, f"{arch}.block_count")
    _check_block_count(g, arch, n_layer)
    n_vocab = _n_vocab(g, arch)
    _check_embedding(g, arch, n_vocab, n_embd)
    n_head = _positive(g, f"{arch}.attention.head_count")
    n_head_kv = _positive(g, f"{arch}.attention.head_count_kv", n_head)
    if n_head % n_head_kv:
        raise GGUFError(g.path, f"key '{arch}.attention.head_count_kv'",
                        f"expected a divisor of head_count {n_head}, got {n_head_kv}")
    head_dim = _positive(g, f"{arch}.attention.key_length", max(n_embd // n_head, 1))
    head_dim_v = _positive(g, f"{arch}.attention.value_length", head_dim)
    norm_key = "layer_norm_epsilon" if arch == "gpt2" else "layer_norm_rms_epsilon"
    common = dict(
        arch=arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
        n_head_kv=n_head_kv, head_dim=head_dim, head_dim_v=head_dim_v,
        n_ff=_positive(g, f"{arch}.feed_forward_length"), n_vocab=n_vocab,
        n_ctx_train=_positive(g, f"{arch}.context_length"),
        eps=_positive_float(g, f"{arch}.attention.{norm_key}"),
        attn_scale=1.0 / math.sqrt(head_dim),
    )
    if arch == "gpt2":
        return ModelConfig(**common, rope=None)
    rope = _rope(g, arch, head_dim, neox=arch != "llama")
    if arch in MOE_ARCHITECTURES:
        common["moe"] = _moe(g, arch)
    if arch == "gpt-oss":
        return ModelConfig(**common, rope=rope,
                           **_sliding(g, arch, n_layer, GPT_OSS_SLIDING_PERIOD))
    if arch != "gemma3":
        return ModelConfig(**common, rope=rope)
    local = RopeParams(n_rot=rope.n_rot, base=GEMMA3_SLIDING_ROPE_BASE, neox=True)
    return ModelConfig(**common, rope=rope, rope_local=local, embed_scale=math.sqrt(n_embd),
                       **_sliding(g, arch, n_layer, GEMMA3_SLIDING_PERIOD))
