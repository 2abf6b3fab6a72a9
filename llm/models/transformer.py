"""One decoder-only transformer for every supported architecture, written against `Backend` ops.

Input: a `Step` (llm/step.py: token ids, positions, the sequences they belong to, the rows to
keep) and a KV cache per sequence: rows of one sequence (a prompt chunk or a decode token), one
new token of each of several sequences (batched decode, the weights read once for all of them),
or several prompts (their tokens through the matmuls together, attention per prompt). One
`forward(step, caches)` runs them all; the kinds differ only in the backend's attention and the
kept rows. Output: logits (backend activation) of the kept rows.
Architectures differ by `ArchSpec` switches (norm kind, FFN kind, q/k norm, post-norms,
learned positions) and `ModelConfig` values (RoPE per layer, sliding window, embedding scale),
never by a second copy of this loop.
"""
from __future__ import annotations

from typing import Sequence

from llm import step as S
from llm.backends.base import Backend, KVCache
from llm.config import ModelConfig
from llm.models.archs import ArchSpec
from llm.models.moe import moe_ffn
from llm.models.weights import LayerWeights, ModelWeights, Norm
from llm.step import Step


class StepRunner:
    """What runs forward steps: a `Transformer`, or a wrapper around one that replays captured
    graphs (llm/backends/kernels_graph.py). Callers build a `Step` (or use the thin constructors
    below) and call forward(step, caches). The capability defaults mean "not here", so callers
    ask without probing."""
    cfg: ModelConfig
    spec: ArchSpec
    backend: Backend
    prefill_graph_max = 0          # longest prompt that runs as a captured graph (0: none)
    min_prompts_together = 2       # fewest admitted prompts run as one pass (batching)
    prefill_step_tokens: int | None = None   # tokens per prefill step (None: generate's own)

    def forward(self, step: Step, caches: Sequence[KVCache]):
        """Logits (backend activation) of the step's kept rows; its keys and values are
        written into caches (one per sequence of the step)."""
        raise NotImplementedError

    def forward_tokens(self, ids, start: int, cache: KVCache, all_logits: bool = False):
        """Logits (n, n_vocab) for ids at positions start..start+n-1 of `cache`, or (1,
        n_vocab) for the last one."""
        return self.forward(S.tokens(ids, start, all_logits), [cache])

    def forward_batch(self, ids, positions, caches: list):
        """Logits (n, n_vocab): row i after token ids[i] of sequence i, at positions[i] of its
        own cache caches[i] (batched decode: the weights read once for all of them)."""
        return self.forward(S.batch(ids, positions, len(caches)), caches)

    def forward_prompts(self, prompts: list, starts: list, caches: list):
        """Logits (len(prompts), n_vocab): row i after the last token of prompts[i] (token
        ids), run at positions starts[i].. of its own cache caches[i]. One pass for all their
        tokens: each weight matrix is read once for the lot, as a server wants for the prompts
        it admits together; each prompt's attention sees its own cache alone."""
        return self.forward(S.prompts(prompts, starts, len(caches)), caches)

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


class Transformer(StepRunner):
    def __init__(self, cfg: ModelConfig, spec: ArchSpec, weights: ModelWeights, backend: Backend):
        self.cfg, self.spec, self.w, self.backend = cfg, spec, weights, backend
        q, k = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
        self._qkv_sizes = (q, k, cfg.n_head_kv * cfg.head_dim_v)

    def _norm(self, x, norm: Norm):
        if self.spec.norm == "layer":
            return self.backend.layer_norm(x, norm.weight, norm.bias, self.cfg.eps)
        return self.backend.rms_norm(x, norm.weight, self.cfg.eps)

    def _attention(self, h, lw: LayerWeights, il: int, step: Step, caches):
        b, cfg = self.backend, self.cfg
        qkv = b.matmul(h, lw.qkv, lw.qkv_bias)
        rope, positions = cfg.layer_rope(il), step.positions
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
        out = b.attention(q, k, v, step, caches, il, cfg.attn_scale, cfg.layer_window(il),
                          **sinks_arg(lw.attn_sinks))
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

    def forward(self, step: Step, caches: Sequence[KVCache]):
        """The step's rows through every layer; logits (backend activation) of its kept rows
        (step.keep). The backend receives the step's ids (embed), positions (rope) and the
        step itself (attention: which rows go to which cache at which position)."""
        b, w, cfg = self.backend, self.w, self.cfg
        step = b.begin_forward(step, caches)
        x = b.all_reduce(b.embed(w.token_embd, step.ids, cfg.embed_scale))  # vocab split (tp)
        if w.position_embd is not None:
            x = b.add(x, b.embed(w.position_embd, step.positions))
        for il, lw in enumerate(w.layers):
            b.begin_layer(il)
            h = self._attention(self._norm(x, lw.attn_norm), lw, il, step, caches)
            if lw.post_attn_norm is not None:
                h = self._norm(h, lw.post_attn_norm)
            x = b.add(x, h)
            h = self._ffn(self._norm(x, lw.ffn_norm), lw)
            if lw.post_ffw_norm is not None:
                h = self._norm(h, lw.post_ffw_norm)
            x = b.add(x, h)
        b.end_layers()
        if step.keeps_last:
            x = b.last_row(x)
        elif step.keep is not None:
            x = b.rows(x, step.keep)
        return b.end_forward(b.matmul(self._norm(x, w.output_norm), w.output))


def sinks_arg(sinks) -> dict:
    """The attention op's `sinks` argument, passed only for a layer that has sinks, so a
    backend without the "attn_sinks" feature is called as before."""
    return {} if sinks is None else {"sinks": sinks}
