"""The MoE feed-forward in one call (experts.py's module docstring has the contract):
moe_ffn_into picks the decode path (few tokens) or the grouped path (prompts)."""
from __future__ import annotations

import numpy as np

from ..quant.q8_1 import quantize_q8_1_into
from . import expert_kernels as ek
from .experts import (DECODE_TOKENS, ExpertWeights, MoeWorkspace, _q8, down_into,
                      fused_q8_1_applies, glu_into, units_into)
from .grouped_gemm import gemm_applies, grouped_ffn_into
from .grouping import combine_kernel, gather_kernel, group_into, max_tiles

# The grouped GEMM from this many tokens (else the tiled DP4A GEMV). The GEMV's DP4A work is
# its floor at prompts (512 tokens: 2618 us a layer for qwen3-30b-a3b, ~7 TMAC/s, 150 GB/s
# of weights; benchmarks/RESULTS.md "MoE FFN per layer"): at that rate a qwen3 pair costs
# 3 x 768 x 2048 MAC / 7e12 = 0.65 us, and 8 tokens (64 pairs, ~50 of 128 experts, ~130 MB
# of Q4_K) take ~42 us of DP4A against ~43 us of weight reads: from there the GEMV is
# compute-bound while the tensor cores stay bound by the same weight bytes. The dense rule
# agrees (options.int8_gemm_tokens: the int8 GEMM beats the DP4A GEMV from 6 tokens).
GEMM_TOKENS = 8
# MXFP4 experts (gpt-oss: K = 2880, not a multiple of 256) go through the per-32-block GEMM,
# whose byte-wise loads make it the slower side at few tokens: measured on the H200
# (RESULTS.md, "MoE prompts on the grouped GEMM"), gpt-oss-20b per layer: GEMM 1099 / 1568 /
# 2612 us at 8 / 64 / 512 tokens, the tiled GEMV 274 us at 8 and 3837 at 512; the two lines
# cross near 210 tokens.
GEMM_TOKENS_BY_TYPE = {"MXFP4": 256}


def gemm_from(gate: ExpertWeights, down: ExpertWeights) -> int:
    """The token count from which the grouped GEMM serves these experts."""
    return max(GEMM_TOKENS_BY_TYPE.get(w.type_name, GEMM_TOKENS) for w in (gate, down))


def moe_ffn_into(ws: MoeWorkspace, gate: ExpertWeights, up: ExpertWeights,
                 down: ExpertWeights, x, y, ids, route_w, tokens: int, act: str = "silu",
                 gate_bias=None, up_bias=None, down_bias=None, res=None, stream=None,
                 grouped: bool | None = None, xq=None, gemm: bool | None = None) -> None:
    """y (tokens, n_embd) = (res +) the k experts' weighted outputs (res may be y).
    grouped None: the grouped path above DECODE_TOKENS tokens; True/False forces one.
    gemm (grouped path): the tensor-core grouped GEMM (grouped_gemm.py) or the tiled GEMV;
    None: the GEMM where it serves the types (gemm_applies) from gemm_from(gate, down) tokens.
    xq: x already as Q8_1 rows (tokens, q8_1_bytes(n_embd)) uint8 (e.g. from rmsnorm_q8_1),
    used instead of quantizing x when the gate/up type takes Q8_1."""
    _check(ws, gate, up, down, x, y, ids, route_w, tokens)
    k = ws.k
    xin = x
    if _q8(gate) and xq is not None:
        xin = xq.reshape(tokens, -1)
    elif _q8(gate):
        xin = ws.xq[:tokens]
        quantize_q8_1_into(x.reshape(tokens, -1), xin, stream=stream)
    if not (tokens > DECODE_TOKENS if grouped is None else grouped):
        h = ws.h[:tokens * k]
        if _q8(down) and fused_q8_1_applies(gate, ws.config, tiled=False):
            hin = ws.hq[:tokens * k]     # the GEMV writes h as Q8_1 itself
            glu_into(gate, up, xin, h, ids, ids, tokens * k, k, act, gate_bias, up_bias,
                     config=ws.config, stream=stream, hq=hin)
        else:
            glu_into(gate, up, xin, h, ids, ids, tokens * k, k, act, gate_bias, up_bias,
                     config=ws.config, stream=stream)
            hin = _down_input(ws, down, h, stream)
        down_into(down, hin, y, ids, route_w, tokens, k, down_bias, res, ws.config, stream)
        return
    if gemm or (gemm is None and gemm_applies(gate, down) and tokens >= gemm_from(gate, down)):
        grouped_ffn_into(ws, gate, up, down, xin, y, ids, route_w, tokens, act, gate_bias,
                         up_bias, down_bias, res, stream)
        return
    pairs = tokens * k
    padded = pairs + ws.config.batch - 1     # a tile's rows past its count are read, unused
    n_tiles = max_tiles(pairs, ws.n_expert, ws.config.batch)
    group_into(ids, ws.order, ws.slot_of, ws.tiles, pairs, ws.n_expert, ws.config.batch,
               stream)
    words = xin.nbytes // tokens // 4        # one token's Q8_1 or f32 row in u32 words
    x_sorted = ws.x_sorted.reshape(-1)[:padded * words]
    gather_kernel[pairs, 128, stream](xin.reshape(-1).view(np.uint32), x_sorted,
                                           ws.order, words, k)
    h = ws.h[:padded]
    glu_into(gate, up, x_sorted, h, ids, ws.tiles, n_tiles, 1, act, gate_bias, up_bias,
             tiled=True, config=ws.config, stream=stream)
    units_into(down, down, _down_input(ws, down, h, stream), ws.ys, ids, ws.tiles, n_tiles,
               1, ek.GLU_NONE, down_bias, None, True, ws.config, stream)
    combine_kernel[((down.rows + 127) // 128, tokens), 128, stream](
        ws.ys, ws.slot_of, route_w, ws.ys, ids, y if res is None else res, y, down.rows, k,
        res is not None, False)


def _down_input(ws: MoeWorkspace, down: ExpertWeights, h, stream):
    """The down projection's input: h quantized to Q8_1 (into ws.hq) or h itself."""
    if not _q8(down):
        return h
    hq = ws.hq[:h.shape[0]]
    quantize_q8_1_into(h, hq, stream=stream)
    return hq


def _check(ws, gate, up, down, x, y, ids, route_w, tokens):
    if not 1 <= tokens <= ws.max_tokens:
        raise ValueError(f"moe: tokens {tokens} outside 1..{ws.max_tokens} (the workspace)")
    if gate.n_expert != ws.n_expert or down.n_expert != ws.n_expert or \
            down.n != gate.rows or down.rows != gate.n:
        raise ValueError(f"moe: expert shapes gate {gate.n_expert}x{gate.rows}x{gate.n}, down "
                         f"{down.n_expert}x{down.rows}x{down.n} do not chain for "
                         f"{ws.n_expert} experts")
    if x.dtype != np.float32 or x.size != tokens * gate.n or y.size != tokens * down.rows:
        raise ValueError(f"moe: x must be float32 ({tokens}, {gate.n}) and y ({tokens}, "
                         f"{down.rows}), got {x.dtype} {tuple(x.shape)}, {tuple(y.shape)}")
    for a, dtype, name in ((ids, np.int32, "ids"), (route_w, np.float32, "route_w")):
        if a.dtype != dtype or a.size != tokens * ws.k:
            raise ValueError(f"moe: {name} must be {np.dtype(dtype)} ({tokens}, {ws.k}), got "
                             f"{a.dtype} {tuple(a.shape)}")
