"""The mixture-of-experts parts of synthetic GGUF models (`llm/synth.py`): qwen3moe and gpt-oss.

Input: a `Shape` with a `MoeShape` and a file type. Output: the extra metadata (expert counts,
gpt-oss's sliding window and YaRN keys) and each layer's extra tensors: the router
(`ffn_gate_inp`, F32 as llama.cpp never quantizes it), the stacked experts
`ffn_{gate,up,down}_exps` (n_expert, rows, cols) and, for gpt-oss, the q/k/v/o, router and
expert biases and the attention sinks (F32). Experts are MXFP4 where the shape says so
(gpt-oss, as its published files) or the file type is MXFP4, else typed like the dense FFN
matrices of that file type (Q4_K_M: ffn_down_exps Q6_K in the use_more_bits layers).
MXFP4 blocks are random nibbles under a random e8m0 scale near WEIGHT_STD's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGMLQuantizationType as Q

# e2m1 magnitudes as ggml's table holds them (doubled: 0 1 2 3 4 6 8 12), sign in bit 3;
# value = table[q] * 2^(e - 128) (the e8m0 scale halved): rms of a random nibble's table entry
MXFP4_TABLE_RMS = float(np.sqrt(np.mean(np.square([0, 1, 2, 3, 4, 6, 8, 12]))))


@dataclass(frozen=True)
class MoeShape:
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    mxfp4_experts: bool = False   # gpt-oss: experts MXFP4 whatever the file type
    sliding_window: int = 0       # gpt-oss: layers il % 2 == 0 attend to this many positions
    yarn_factor: float = 0.0      # gpt-oss: YaRN RoPE scaling from yarn_orig_ctx positions
    yarn_orig_ctx: int = 0
    biases: bool = False          # gpt-oss: q/k/v/o, router, expert biases and attention sinks


def moe_metadata(w: GGUFWriter, arch: str, m: MoeShape) -> None:
    w.add_uint32(f"{arch}.expert_count", m.n_expert)
    w.add_uint32(f"{arch}.expert_used_count", m.n_expert_used)
    w.add_uint32(f"{arch}.expert_feed_forward_length", m.n_ff_exp)
    if m.sliding_window:
        w.add_uint32(f"{arch}.attention.sliding_window", m.sliding_window)
    if m.yarn_factor:
        w.add_string(f"{arch}.rope.scaling.type", "yarn")
        w.add_float32(f"{arch}.rope.scaling.factor", m.yarn_factor)
        w.add_uint32(f"{arch}.rope.scaling.original_context_length", m.yarn_orig_ctx)
        w.add_float32(f"{arch}.rope.scaling.yarn_beta_fast", 32.0)
        w.add_float32(f"{arch}.rope.scaling.yarn_beta_slow", 1.0)


def expert_type(m: MoeShape, dense_type: Q, file_type: str) -> Q:
    return Q.MXFP4 if m.mxfp4_experts or file_type == "MXFP4" else dense_type


def moe_layer_plan(m: MoeShape, p: str, n_embd: int, dense_type) -> list:
    """Layer p's router and experts (name, type, numpy shape); dense_type(name, cols) is the
    type a dense FFN matrix of that name would have in this file."""
    e, n, f = n_embd, m.n_expert, m.n_ff_exp
    plan = [(p + "ffn_gate_inp.weight", Q.F32, (n, e)),
            (p + "ffn_gate_exps.weight", dense_type("ffn_gate", e), (n, f, e)),
            (p + "ffn_up_exps.weight", dense_type("ffn_up", e), (n, f, e)),
            (p + "ffn_down_exps.weight", dense_type("ffn_down", f), (n, e, f))]
    if m.biases:
        plan += [(p + "ffn_gate_inp.bias", Q.F32, (1, n)),
                 (p + "ffn_gate_exps.bias", Q.F32, (n, f)),
                 (p + "ffn_up_exps.bias", Q.F32, (n, f)),
                 (p + "ffn_down_exps.bias", Q.F32, (n, e))]
    return plan


def attention_extras(m: MoeShape, p: str, n_embd: int, n_head: int) -> list:
    """gpt-oss's output-projection bias and per-head sink logits."""
    if not m.biases:
        return []
    return [(p + "attn_output.bias", Q.F32, (1, n_embd)),
            (p + "attn_sinks.weight", Q.F32, (1, n_head))]


def random_mxfp4(rng: np.random.Generator, n_values: int, std: float) -> np.ndarray:
    """uint8 MXFP4 blocks (17 B: e8m0 scale | 16 B of e2m1 nibbles) of n_values weights with
    mean 0 and a spread of about std: the scale exponent is log2(std / table rms) + 128,
    dithered by one between blocks."""
    n_blocks = n_values // 32
    blocks = np.frombuffer(rng.bytes(n_blocks * 17), np.uint8).reshape(n_blocks, 17).copy()
    exponent = np.log2(std / MXFP4_TABLE_RMS) + 128
    blocks[:, 0] = np.floor(exponent + rng.random(n_blocks)).astype(np.uint8)
    return blocks.reshape(-1)
