"""The MoE feed-forward's GPU time per layer (issue 46): router + stdlib_kernels.moe.moe_ffn_into
on real model shapes with random expert bytes (timing only), `layers` layers of distinct
weights per graph replay so L2 cannot keep one layer's experts for the next.

Reported per shape and token count: microseconds per layer and, for decode, the bandwidth of
the selected experts' bytes (k experts x tokens, at most n_expert distinct) over that time.

    python3 benchmarks/moe_ffn.py [--shapes qwen3-30b-a3b,gpt-oss-20b,gpt-oss-120b]
        [--tokens 1,4,512] [--layers 8] [--gemm auto|on|off]

--gemm: prompts (grouped path) on the int8 grouped GEMM (on), the tiled DP4A GEMV (off), or
moe_ffn_into's choice (auto: the GEMM from ffn.GEMM_TOKENS tokens).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks._timing import replay_seconds  # noqa: E402
from stdlib_kernels.moe.experts import MoeWorkspace, expert_weights  # noqa: E402
from stdlib_kernels.moe.ffn import DECODE_TOKENS, moe_ffn_into  # noqa: E402
from stdlib_kernels.moe.router import route_into  # noqa: E402
from stdlib_kernels.quant.reference import row_bytes  # noqa: E402

# name: (n_embd, n_ff, n_expert, k, gate/up type, down type, act, router mode, biases)
SHAPES = {
    "qwen3-30b-a3b": (2048, 768, 128, 8, "Q4_K", "Q6_K", "silu", "softmax_norm", False),
    "gpt-oss-20b": (2880, 2880, 32, 4, "MXFP4", "MXFP4", "oai", "topk_softmax", True),
    "gpt-oss-120b": (2880, 2880, 128, 4, "MXFP4", "MXFP4", "oai", "topk_softmax", True),
}


def random_experts(rng, type_name, n_expert, rows, n):
    raw = rng.integers(0, 256, (n_expert, rows, row_bytes(type_name, n)), dtype=np.uint8)
    return expert_weights(pk.to_device(raw), type_name, n_expert)


def layer_time(rng, shape, tokens: int, layers: int, gemm=None) -> tuple[float, float]:
    n_embd, n_ff, n_expert, k, gtype, dtype_, act, mode, biased = shape
    ws = MoeWorkspace(tokens, k, n_embd, n_ff, n_expert)
    stacks = [[random_experts(rng, gtype, n_expert, n_ff, n_embd),
               random_experts(rng, gtype, n_expert, n_ff, n_embd),
               random_experts(rng, dtype_, n_expert, n_embd, n_ff)] for _ in range(layers)]
    bias = [pk.to_device(rng.standard_normal((n_expert, r)).astype(np.float32) * 0.1)
            if biased else None for r in (n_ff, n_ff, n_embd)]
    x = pk.to_device(rng.standard_normal((tokens, n_embd)).astype(np.float32))
    y = pk.empty((tokens, n_embd), np.float32)
    logits = pk.to_device(rng.standard_normal((tokens, n_expert)).astype(np.float32))
    ids, w = pk.empty((tokens, k), np.int32), pk.empty((tokens, k), np.float32)

    def record():
        for gate, up, down in stacks:
            route_into(logits, ids, w, k, mode)
            moe_ffn_into(ws, gate, up, down, x, y, ids, w, tokens, act, *bias, res=y,
                         gemm=gemm)

    seconds = replay_seconds(record) / layers
    active = min(tokens * k, n_expert)
    per_expert = (2 * n_ff * row_bytes(gtype, n_embd) + n_embd * row_bytes(dtype_, n_ff))
    return seconds, active * per_expert / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", default="1,4,512")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--gemm", choices=("auto", "on", "off"), default="auto")
    args = ap.parse_args()
    pk.set_device("cuda")
    rng = np.random.default_rng(0)
    for name in args.shapes.split(","):
        for tokens in (int(t) for t in args.tokens.split(",")):
            gemm = {"auto": None, "on": True, "off": False}[args.gemm]
            seconds, rate = layer_time(rng, SHAPES[name], tokens, args.layers,
                                       gemm if tokens > DECODE_TOKENS else None)
            print(f"{name:14s} tokens {tokens:4d}: {seconds * 1e6:8.1f} us/layer, selected "
                  f"experts' bytes at {rate / 1e9:7.1f} GB/s (upper bound for prompts)")


if __name__ == "__main__":
    main()
