"""The runner's hook for the persistent decode step (stdlib_kernels/persistent/decode.py): a
model loaded on the kernels backend -> its decode schedule, flat f32 weights and a DecodeRunner.

    pd = PersistentDecode.from_model(model)          # llm.load(..., backend="kernels")
    pd.load_cache(cache, n_rows)                     # after a prefill through the runner
    logits = pd.step(token, pos)                     # one launch per token

Input: the backend's own device weights (DeviceMatrix row groups, norm vectors, the embedding
table), read back once and expanded to f32 (F32 rows as they are, other types dequantized on
the host: the persistent kernel reads f32 weights for now), and a KernelsKVCache whose rows
0..n-1 the prefill wrote. Output: logits (n_vocab,) numpy per step; the step's K/V rows in the
runner's own f32 cache (DecodeRunner.cache_k / cache_v).

Scope: llama-style models (RMSNorm, SwiGLU, RoPE without scaling or frequency factors, no
biases, q/k norms, post-norms, sliding windows or MoE); anything else is refused by name.
The persistent kernel keeps its own KV cache: the backend's KVPool holds one allocation per
layer, and the kernel takes one pointer for all layers (one pool allocation would let it share
the runner's; see docs/design.md).
"""
from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType

from llm.backends.dequant import dequantize
from stdlib_kernels.persistent.decode import DecodeRunner
from stdlib_kernels.persistent.decode_schedule import (
    DecodeShape,
    decode_schedule,
    pack_decode_weights,
)


class UnsupportedModel(ValueError):
    """A model the persistent decode step does not cover (yet)."""


def check_supported(cfg, spec, weights) -> None:
    """Raise UnsupportedModel naming the first feature outside the persistent step's scope."""
    rope = cfg.rope
    problems = {
        f"norm {spec.norm!r} (needs 'rms')": spec.norm != "rms",
        f"ffn {spec.ffn!r} (needs 'swiglu')": spec.ffn != "swiglu",
        "q/k norms": spec.qk_norm, "post-norms": spec.post_norms,
        "learned positions": spec.learned_positions, "attention sinks": spec.attn_sinks,
        "a mixture of experts": bool(spec.moe_gating) or cfg.moe is not None,
        f"ffn norm tensor {spec.ffn_norm!r}": spec.ffn_norm != "ffn_norm",
        "no RoPE": rope is None,
        "scaled RoPE (freq_scale, YaRN)": rope is not None and (rope.freq_scale != 1.0
                                                                 or rope.yarn is not None),
        "RoPE frequency factors": weights.rope_freqs is not None,
        "per-layer RoPE / sliding windows": cfg.rope_local is not None or cfg.sliding_window,
        f"embedding scale {cfg.embed_scale}": cfg.embed_scale != 1.0,
        "a value head size other than the key head size": cfg.head_dim_v != cfg.head_dim,
    }
    for layer in weights.layers:
        problems["biases"] = problems.get("biases") or any(
            b is not None for b in (layer.qkv_bias, layer.attn_out_bias, layer.gate_up_bias,
                                    layer.down_bias, layer.attn_norm.bias, layer.ffn_norm.bias))
    found = [name for name, present in problems.items() if present]
    if found:
        raise UnsupportedModel(f"persistent decode: {cfg.arch} model has {', '.join(found)}; "
                               f"it covers llama-style models only")


def matrix_f32(m) -> np.ndarray:
    """A DeviceMatrix (row groups of GGUF types) as f32 (n_out, n_in) on the host."""
    out = np.empty((m.n_out, m.n_in), np.float32)
    for g in m.groups:
        dequantize(np.ascontiguousarray(g.raw.numpy()).reshape(-1),
                   GGMLQuantizationType[g.type_name], (g.rows, m.n_in),
                   out=out[g.row_off:g.row_off + g.rows])
    return out


def model_tensors(cfg, weights) -> dict:
    """DecodeShape.weight_shapes' names -> f32 host arrays, from the backend's device weights."""
    table = weights.token_embd
    embd = np.empty((cfg.n_vocab, table.n), np.float32)
    dequantize(np.ascontiguousarray(table.raw.numpy()).reshape(-1),
               GGMLQuantizationType[table.type_name], embd.shape, out=embd)
    tensors = {"token_embd": embd, "output_norm": weights.output_norm.weight.numpy(),
               "output": matrix_f32(weights.output)}
    for il, lw in enumerate(weights.layers):
        blk = f"blk.{il}."
        tensors.update({blk + "attn_norm": lw.attn_norm.weight.numpy(),
                        blk + "qkv": matrix_f32(lw.qkv), blk + "attn_out": matrix_f32(lw.attn_out),
                        blk + "ffn_norm": lw.ffn_norm.weight.numpy(),
                        blk + "gate_up": matrix_f32(lw.gate_up), blk + "down": matrix_f32(lw.down)})
    return tensors


class PersistentDecode:
    """One model's persistent decode step (module docstring)."""

    def __init__(self, runner: DecodeRunner, cfg):
        self.runner, self.cfg = runner, cfg

    @classmethod
    def from_model(cls, model, n_ctx: int | None = None, tile_rows: int = 16,
                   grid: int | None = None) -> PersistentDecode:
        """From an llm.Model loaded on the kernels backend (its transformer, or a GraphRunner
        around one); n_ctx: the KV cache rows (default the model's context)."""
        if getattr(model.backend, "name", None) != "kernels":
            raise UnsupportedModel("persistent decode: the model must be loaded with "
                                   "backend='kernels'")
        transformer = getattr(model.transformer, "model", model.transformer)
        cfg, spec, weights = transformer.cfg, transformer.spec, transformer.w
        check_supported(cfg, spec, weights)
        shape = DecodeShape(cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim,
                            cfg.n_ff, cfg.n_vocab, int(n_ctx or model.n_ctx))
        sched = decode_schedule(shape, tile_rows)
        flat = pack_decode_weights(sched, model_tensors(cfg, weights))
        rope = cfg.rope
        runner = DecodeRunner(sched, flat, eps=cfg.eps, scale=cfg.attn_scale,
                              rope_theta=rope.base, rot_dim=rope.n_rot, neox=rope.neox,
                              grid=grid)
        return cls(runner, cfg)

    def load_cache(self, cache, n_rows: int) -> None:
        """Rows 0..n_rows-1 of every layer of a KernelsKVCache (f32 or f16) into the
        persistent step's cache (after a prefill through the runner)."""
        if getattr(cache, "q8", False):
            raise UnsupportedModel("persistent decode: a q8_0 KV cache is not supported")
        if n_rows > self.runner.sched.shape.n_ctx:
            raise ValueError(f"load_cache: {n_rows} rows, the persistent cache holds "
                             f"{self.runner.sched.shape.n_ctx}")
        for il in range(self.cfg.n_layer):
            self.runner.set_cache(il, cache.k[il].numpy()[:, :n_rows],
                                  cache.v[il].numpy()[:, :n_rows])

    def step(self, token: int, pos: int) -> np.ndarray:
        """Logits (n_vocab,) after `token` at position `pos` (rows < pos already cached)."""
        return self.runner.step(int(token), int(pos))
