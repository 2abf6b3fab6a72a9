"""Host API of the expert kernels: the MoE feed-forward on the current device, graph-capturable
(routing ids and weights never leave the device).

    expert_weights(raw, type, n_expert)  device uint8 (n_expert, rows, row_bytes) or
                                         (n_expert * rows, row_bytes) -> ExpertWeights
    MoeWorkspace(max_tokens, k, n_embd, n_ff, n_expert)   buffers, allocated once
    moe_ffn_into(ws, gate, up, down, x, y, ids, route_w, tokens, act="silu",   (ffn.py)
                 gate_bias=None, up_bias=None, down_bias=None, res=None, stream=None)
        y (tokens, n_embd) = (res +) sum_j route_w[t, j] down_e(act(gate_e x_t, up_e x_t)),
        e = ids[t, j]; x (tokens, n_embd) f32; ids i32 / route_w f32 (tokens, k) (router.py);
        biases f32 (n_expert, rows) or None; act "silu" (SwiGLU) or "oai" (gpt-oss's clamped)
    glu_into / down_into / units_into   the single launches (decode paths, tiles)

Up to DECODE_TOKENS tokens take the decode path: one unit per (token, slot) pair reads only
its expert's rows (gate and up in one launch with the activation, moe_gemv_kernel), then the
down projection with the k experts' weighted sum fused into its store (moe_down_kernel).
More tokens take the grouped path (grouping.py): pairs sorted by expert on the device, the
activations gathered in that order, tiles of up to `batch` rows of one expert (each weight
row read once per tile), the down projection per tile, then the weighted sum (combine);
from ffn.GEMM_TOKENS tokens the same order on int8 tensor cores instead (grouped_gemm.py).
Each matrix uses Q8_1 activations and DP4A where its type has them (GEMV_Q8; one Q8_1
quantize of x and one of the hidden rows), else f32 activations (F32, F16, BF16).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

import pykernel as pk

from ..quant.formats import get_format
from ..quant.gemv import F32_TYPES, Q8_1_TYPES, word_dtype
from ..quant.q8_1 import q8_1_bytes
from . import expert_kernels as ek
from .grouping import max_tiles

DECODE_TOKENS = 4
ACTS = {"silu": ek.GLU_SILU, "oai": ek.GLU_OAI}


class ExpertWeights(NamedTuple):
    """One stacked expert tensor on the device: flat words, format, (n_expert, rows, n)."""
    words: object
    type_name: str
    n_expert: int
    rows: int
    n: int


class MoeConfig(NamedTuple):
    """warps per block, rows per warp, tile rows of the grouped path (<= 8)."""
    warps: int = 4
    rows: int = 2
    batch: int = 8


CPU_CONFIG = MoeConfig(warps=2, rows=1, batch=4)


def default_config() -> MoeConfig:
    return CPU_CONFIG if pk.current_device().kind == "cpu" else MoeConfig()


def expert_weights(raw, type_name: str, n_expert: int) -> ExpertWeights:
    """Check and view a stacked expert tensor (module docstring) for the kernels (no copy)."""
    fmt = get_format(type_name)
    if type_name not in F32_TYPES:
        raise ValueError(f"moe: no expert kernel for {type_name}; supported: {F32_TYPES}")
    if raw.dtype != np.uint8 or raw.ndim not in (2, 3) or raw.shape[0] % n_expert or \
            (raw.ndim == 3 and raw.shape[0] != n_expert):
        raise ValueError(f"moe {type_name}: expert weights must be uint8 (n_expert={n_expert}"
                         f", rows, row_bytes), got {raw.dtype} {tuple(raw.shape)}")
    rows = raw.shape[1] if raw.ndim == 3 else raw.shape[0] // n_expert
    n = raw.shape[-1] // fmt.block_bytes * fmt.block_elems
    if n <= 0 or raw.shape[-1] % fmt.block_bytes or n % 32:
        raise ValueError(f"moe {type_name}: rows of {raw.shape[-1]} bytes are not whole rows "
                         f"of a multiple of 32 values")
    words = raw.reshape(-1).view(word_dtype(type_name))
    if words.size >= 2**31 or raw.ptr % 16:
        raise ValueError(f"moe {type_name}: the stacked tensor must hold < 2^31 words and be "
                         f"16-byte aligned")
    return ExpertWeights(words, type_name, n_expert, rows, n)


class MoeWorkspace:
    """Device buffers for up to max_tokens tokens of k experts each (allocated once).
    alloc(shape, dtype) makes each buffer (default pk.empty; a runner passes its arena's, so
    that a captured graph replays on the buffers it was captured with)."""

    def __init__(self, max_tokens: int, k: int, n_embd: int, n_ff: int, n_expert: int,
                 config: MoeConfig | None = None, alloc=None):
        self.config = config or default_config()
        alloc = alloc or pk.empty
        self.max_tokens, self.k, self.n_expert = max_tokens, k, n_expert
        pairs = max_tokens * k
        padded = pairs + self.config.batch - 1     # a short last tile reads past its rows
        x_words = max(n_embd, q8_1_bytes(n_embd) // 4)
        self.xq = alloc((max_tokens, q8_1_bytes(n_embd)), np.uint8)
        self.x_sorted = alloc((padded, x_words), np.uint32)
        self.h = alloc((padded, n_ff), np.float32)
        self.u = alloc((pairs, n_ff), np.float32)      # the grouped GEMM's up rows (h: gate)
        self.hq = alloc((padded, q8_1_bytes(n_ff)), np.uint8)
        self.ys = alloc((pairs, n_embd), np.float32)
        self.order = alloc((pairs,), np.int32)
        self.slot_of = alloc((pairs,), np.int32)
        self.tiles = alloc((max_tiles(pairs, n_expert, self.config.batch), 3), np.int32)


def _q8(wt: ExpertWeights) -> bool:
    return wt.type_name in Q8_1_TYPES


def _kernel_spec(wt: ExpertWeights, q8: bool):
    """(FMT, ITEMS, x dtype, ACT) for the base kernel of the weights' format."""
    if q8:
        return get_format(wt.type_name).id, Q8_1_TYPES[wt.type_name], np.uint32, ek.ACT_Q8
    return get_format(wt.type_name).id, 1, np.float32, ek.ACT_F32


class _Launch(NamedTuple):
    """What moe_gemv_kernel and moe_down_kernel launches share for weights wt and input x."""
    config: MoeConfig
    fmt_id: int
    items: int
    x_type: type            # the input's element type: u32 Q8_1 words or f32
    act: int                # ek.ACT_Q8 / ek.ACT_F32
    x_words: int            # one input row, in elements of x_type
    x_flat: np.ndarray      # the input as a flat view of x_type
    groups: int             # row groups of warps * rows rows (the grid's x)


def _launch(wt: ExpertWeights, x, config: MoeConfig | None) -> _Launch:
    c = config or default_config()
    q8 = _q8(wt)
    fmt_id, items, x_type, act = _kernel_spec(wt, q8)
    x_words = q8_1_bytes(wt.n) // 4 if q8 else wt.n
    groups = (wt.rows + c.warps * c.rows - 1) // (c.warps * c.rows)
    return _Launch(c, fmt_id, items, x_type, act, x_words, x.reshape(-1).view(x_type), groups)


def _row_words(wt: ExpertWeights) -> int:
    fmt = get_format(wt.type_name)
    return wt.n // fmt.block_elems * fmt.block_bytes // np.dtype(word_dtype(wt.type_name)).itemsize


def _blocks(wt: ExpertWeights) -> int:
    return wt.n // get_format(wt.type_name).block_elems


def glu_into(gate: ExpertWeights, up: ExpertWeights, x, h, ids, tiles, units: int,
             x_div: int, act: str, gate_bias=None, up_bias=None, tiled: bool = False,
             config: MoeConfig | None = None, stream=None) -> None:
    """h rows = act(gate_e x + bg, up_e x + bu) (moe_gemv_kernel): per pair (units pairs,
    input row pair // x_div) or per tile (units tiles). x: Q8_1 words or f32 rows as the
    type needs (_q8)."""
    if gate.type_name != up.type_name or gate[2:] != up[2:]:
        raise ValueError("moe: gate and up experts must have the same type and shape")
    if act not in ACTS:
        raise ValueError(f"moe: act must be one of {', '.join(ACTS)}, got {act!r}")
    units_into(gate, up, x, h, ids, tiles, units, x_div, ACTS[act], gate_bias, up_bias, tiled,
          config, stream)


def units_into(w, w2, x, y, ids, tiles, units, x_div, glu, bias, bias2, tiled, config, stream):
    """Launch moe_gemv_kernel over `units` pairs or tiles (expert_kernels.py); glu an
    expert_kernels.GLU_* value."""
    p = _launch(w, x, config)
    c = p.config
    has_bias = bias is not None
    ek.moe_gemv_kernel[(p.groups, units), c.warps * 32, stream](
        w.words, w2.words, p.x_flat, bias if has_bias else y, bias2 if bias2 is not None else y,
        ids, tiles, y, w.rows, _row_words(w), _blocks(w), w.n, p.x_words, x_div, p.fmt_id,
        w.words.dtype, p.x_type, p.act, p.items, c.warps, c.rows, c.batch if tiled else 1, glu,
        has_bias, tiled)


def down_into(down: ExpertWeights, h, y, ids, route_w, tokens: int, k: int, bias=None,
              res=None, config: MoeConfig | None = None, stream=None) -> None:
    """y (tokens, rows) = (res +) sum_j route_w[t, j] (down_e h[t k + j] + b_e)
    (moe_down_kernel); h: Q8_1 words or f32 rows as the type needs (_q8)."""
    p = _launch(down, h, config)
    c = p.config
    ek.moe_down_kernel[(p.groups, tokens), c.warps * 32, stream](
        down.words, p.x_flat, y if bias is None else bias, ids, route_w,
        y if res is None else res, y, down.rows, _row_words(down), _blocks(down), down.n,
        p.x_words, p.fmt_id, down.words.dtype, p.x_type, p.act, p.items, c.warps, c.rows, k,
        bias is not None,
        res is not None)
