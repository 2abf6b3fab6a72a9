"""The mixture-of-experts feed-forward (qwen3moe, gpt-oss): its weights and its forward pass.

Input: a layer's normalised hidden rows (n, n_embd) and its `MoeWeights`. Output: (n, n_embd),
each row the weighted sum of its k selected experts' gated FFNs. The router (`ffn_gate_inp`,
optionally biased) scores every expert; `ArchSpec.moe_gating` says how k weights come out of
those scores (llama.cpp's build_moe_ffn: qwen3moe softmax over all experts, the top k,
renormalised to sum 1; gpt-oss the top k of the raw scores, softmax over those k). An expert is
down(act(gate x + bg, up x + bu)) + bd, with the arch's activation (`ArchSpec.ffn`). Backends
provide the two steps as ops (`moe_route`, `moe_experts`), so a GPU backend can read only the
selected experts' rows and keep the routing on the device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm.backends.base import Backend
from llm.config import ModelConfig
from llm.models.archs import ArchSpec


@dataclass
class MoeWeights:
    router: Any              # (n_expert, n_embd): one score per expert
    router_bias: Any         # (n_expert,) or None
    gate_up: Any             # experts (n_expert, 2 * n_ff_exp, n_embd): gate rows, then up rows
    gate_up_bias: Any        # (n_expert, 2 * n_ff_exp) or None
    down: Any                # experts (n_expert, n_embd, n_ff_exp)
    down_bias: Any           # (n_expert, n_embd) or None


def load_moe_weights(src, cfg: ModelConfig, p: str) -> MoeWeights:
    """Layer p's router and stacked experts, every shape checked (numpy order) by `src`."""
    moe, e = cfg.moe, cfg.n_embd
    n, f = moe.n_expert, moe.n_ff_exp
    return MoeWeights(
        router=src.matrix((f"{p}.ffn_gate_inp.weight", (n, e))),
        router_bias=src.optional_vector((f"{p}.ffn_gate_inp.bias", (n,))),
        gate_up=src.experts((f"{p}.ffn_gate_exps.weight", (n, f, e)),
                            (f"{p}.ffn_up_exps.weight", (n, f, e))),
        gate_up_bias=src.optional_expert_vector((f"{p}.ffn_gate_exps.bias", (n, f)),
                                                (f"{p}.ffn_up_exps.bias", (n, f))),
        down=src.experts((f"{p}.ffn_down_exps.weight", (n, e, f))),
        down_bias=src.optional_expert_vector((f"{p}.ffn_down_exps.bias", (n, e))),
    )


def moe_ffn(backend: Backend, h, weights: MoeWeights, cfg: ModelConfig, spec: ArchSpec):
    """(n, n_embd) hidden rows -> (n, n_embd): route each row to its experts, run them, and sum
    their outputs with the routing weights."""
    scores = backend.matmul(h, weights.router, weights.router_bias)   # (n, n_expert)
    ids, probs = backend.moe_route(scores, cfg.moe.n_expert_used, spec.moe_gating)
    return backend.moe_experts(h, weights, ids, probs, spec.ffn)
