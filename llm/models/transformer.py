"""One decoder-only transformer for every supported architecture, written against `Backend` ops.

Input: token ids of one step, their start position and a KV cache (`forward`), or one new
token for each of several sequences, with their positions and caches (`forward_batch`: batched
decode, the weights read once for all of them), or several prompts, each with its start and
cache (`forward_prompts`: their tokens through the matmuls together, attention per prompt).
Output: logits (backend activation) for every position, the last, or each prompt's last.
Architectures differ by `ArchSpec` switches (norm kind, FFN kind, q/k norm, post-norms,
learned positions) and `ModelConfig` values (RoPE per layer, sliding window, embedding scale),
never by a second copy of this loop.
"""
from __future__ import annotations

import numpy as np

from llm.backends.base import Backend, KVCache
from llm.config import ModelConfig
from llm.models.archs import ArchSpec
from llm.models.moe import moe_ffn
from llm.models.weights import LayerWeights, ModelWeights, Norm


class Transformer:
    # What a graphed wrapper (llm/backends/kernels_graph.py) adds; these defaults mean "not
    # here", so callers ask without probing.
    prefill_graph_max = 0          # longest prompt that runs as a captured graph (0: none)
    min_prompts_together = 2       # fewest admitted prompts run as one pass (batching)
    prefill_step_tokens: int | None = None   # tokens per prefill step (None: generate's own)

    def greedy_tokens(self, first_token: int, pos: int, cache, n: int):
        """Up to n greedy tokens after first_token picked on the device, or None: the host
        picks them."""
        return None

    def sampled_tokens(self, first_token: int, pos: int, cache, n: int, params, uniforms):
        """As greedy_tokens, drawn by the device's sampler; None: the host draws them."""
        return None

    def warm_batch(self, caches) -> None:
        """Compile and capture the batched steps over these caches ahead of serving (graphs)."""

    def precompile_prompts(self, caches, most: int) -> dict:
        """Compile the kernels of prompt passes of up to `most` tokens ahead of serving."""
        return {}

    def drop_batch_graphs(self) -> None:
        """Forget captured batched steps (they hold the slots' caches)."""

    def __init__(self, cfg: ModelConfig, spec: ArchSpec, weights: ModelWeights, backend: Backend):
        self.cfg, self.spec, self.w, self.backend = cfg, spec, weights, backend
        q, k = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
        self._qkv_sizes = (q, k, cfg.n_head_kv * cfg.head_dim_v)

    def _norm(self, x, norm: Norm):
        if self.spec.norm == "layer":
            return self.backend.layer_norm(x, norm.weight, norm.bias, self.cfg.eps)
        return self.backend.rms_norm(x, norm.weight, self.cfg.eps)

    def _attention(self, h, lw: LayerWeights, il: int, positions, attend):
        b, cfg = self.backend, self.cfg
        qkv = b.matmul(h, lw.qkv, lw.qkv_bias)
        rope = cfg.layer_rope(il)
        q_size, k_size, v_size = self._qkv_sizes
        if lw.q_norm is None and rope is not None and b.rope_qk_together:
            # q and k are adjacent columns with the same head size: rotate them in one call
            qk, v = b.split(qkv, (q_size + k_size, v_size))
            qk = b.rope(qk, positions, cfg.head_dim, rope, self.w.rope_freqs)
            q, k = b.split(qk, (q_size, k_size))
        else:
            q, k, v = b.split(qkv, self._qkv_sizes)
            if lw.q_norm is not None:
                q = b.rms_norm(q, lw.q_norm, cfg.eps, group=cfg.head_dim)
                k = b.rms_norm(k, lw.k_norm, cfg.eps, group=cfg.head_dim)
            if rope is not None:
                q = b.rope(q, positions, cfg.head_dim, rope, self.w.rope_freqs)
                k = b.rope(k, positions, cfg.head_dim, rope, self.w.rope_freqs)
        out = attend(q, k, v, il, lw.attn_sinks)
        return b.all_reduce(b.matmul(out, lw.attn_out, lw.attn_out_bias))

    def _ffn(self, h, lw: LayerWeights):
        b = self.backend
        if lw.moe is not None:   # a mixture of experts (llm/models/moe.py)
            return moe_ffn(b, h, lw.moe, self.cfg, self.spec)
        up = b.matmul(h, lw.gate_up, lw.gate_up_bias)
        if self.spec.ffn == "gelu":
            act = b.gelu(up)
        else:
            gate, up = b.split(up, (self.cfg.n_ff, self.cfg.n_ff))
            act = b.swiglu(gate, up) if self.spec.ffn == "swiglu" else b.geglu_tanh(gate, up)
        return b.all_reduce(b.matmul(act, lw.down, lw.down_bias))

    def forward(self, ids: np.ndarray, start: int, cache: KVCache, all_logits: bool = False):
        """Logits (n, n_vocab) for ids at positions start..start+n-1, or (1, n_vocab) for the
        last one; the step's keys and values are written into `cache`."""
        b, cfg = self.backend, self.cfg

        def attend(q, k, v, il, sinks=None):
            return b.attention(q, k, v, cache, il, start, cfg.attn_scale, cfg.layer_window(il),
                               **sinks_arg(sinks))
        positions = np.arange(start, start + len(ids), dtype=np.int64)
        return self._run(ids, positions, attend, all_logits)

    def forward_batch(self, ids: np.ndarray, positions: np.ndarray, caches: list):
        """Logits (n, n_vocab): row i after token ids[i] of sequence i, at positions[i] of its
        own cache caches[i] (where its key and value are written)."""
        b, cfg = self.backend, self.cfg
        if not len(ids) == len(positions) == len(caches):
            raise ValueError(f"forward_batch: {len(ids)} ids, {len(positions)} positions and "
                             f"{len(caches)} caches (one of each per sequence)")

        def attend(q, k, v, il, sinks=None):
            return b.attention_batch(q, k, v, caches, il, positions, cfg.attn_scale,
                                     cfg.layer_window(il), **sinks_arg(sinks))
        return self._run(ids, np.asarray(positions, np.int64), attend, all_logits=True)

    def forward_prompts(self, prompts: list, starts: list, caches: list):
        """Logits (len(prompts), n_vocab): row i after the last token of prompts[i] (token
        ids), run at positions starts[i].. of its own cache caches[i]. One pass for all their
        tokens: each weight matrix is read once for the lot, as a server wants for the prompts
        it admits together; each prompt's attention sees its own cache alone."""
        b, cfg = self.backend, self.cfg
        if not len(prompts) == len(starts) == len(caches) or not all(len(p) for p in prompts):
            raise ValueError(f"forward_prompts: {len(prompts)} prompts (none empty), "
                             f"{len(starts)} starts and {len(caches)} caches (one each)")
        ids, positions = prompt_rows(prompts, starts)
        counts = [len(p) for p in prompts]

        def attend(q, k, v, il, sinks=None):
            return b.attention_prompts(q, k, v, caches, il, starts, counts, cfg.attn_scale,
                                       cfg.layer_window(il), **sinks_arg(sinks))
        return self._run(ids, positions, attend, all_logits=True,
                         rows=np.cumsum(counts) - 1)

    def _run(self, ids, positions: np.ndarray, attend, all_logits: bool, rows=None):
        b, w, cfg = self.backend, self.w, self.cfg
        b.begin_forward(len(ids))
        x = b.all_reduce(b.embed(w.token_embd, ids, cfg.embed_scale))   # vocab-split under tp
        if w.position_embd is not None:
            x = b.add(x, b.embed(w.position_embd, positions))
        for il, lw in enumerate(w.layers):
            b.begin_layer(il)
            h = self._attention(self._norm(x, lw.attn_norm), lw, il, positions, attend)
            if lw.post_attn_norm is not None:
                h = self._norm(h, lw.post_attn_norm)
            x = b.add(x, h)
            h = self._ffn(self._norm(x, lw.ffn_norm), lw)
            if lw.post_ffw_norm is not None:
                h = self._norm(h, lw.post_ffw_norm)
            x = b.add(x, h)
        b.end_layers()
        if rows is not None:
            x = b.rows(x, rows)
        elif not all_logits:
            x = b.last_row(x)
        logits = b.matmul(self._norm(x, w.output_norm), w.output)
        b.end_forward()
        return logits


def sinks_arg(sinks) -> dict:
    """The attention ops' `sinks` argument, passed only for a layer that has sinks, so a
    backend without them (the kernels backend, for now) is called as before."""
    return {} if sinks is None else {"sinks": sinks}


def prompt_rows(prompts: list, starts: list) -> tuple[np.ndarray, np.ndarray]:
    """forward_prompts' rows: every prompt's ids one after the other, and their positions."""
    ids = np.concatenate([np.asarray(p, np.int64).reshape(-1) for p in prompts])
    positions = np.concatenate([np.arange(s, s + len(p), dtype=np.int64)
                                for p, s in zip(prompts, starts)])
    return ids, positions
