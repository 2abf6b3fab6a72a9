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

from ..quant import gemv_kernels as gk
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
    """warps per block, rows per warp (gate / up), tile rows of the grouped path (<= 8), rows
    per warp of the decode path's down projection (each of them for all k experts at once)."""
    warps: int = 4
    rows: int = 2
    batch: int = 8
    down_rows: int = 1


CPU_CONFIG = MoeConfig(warps=2, rows=1, batch=4, down_rows=1)
# Kernel variants the expert GEMVs take where their conditions hold (_weights_spec; else the
# base kernel): type -> (FMT id, items per block, alignment in bytes of the Q8_1 rows that
# their activation loads need). Q4_K: 64-value items, 8-byte activation loads; Q6_K: rows of
# an even number of blocks (4-byte aligned) read as u32 words; MXFP4: five aligned u32 loads
# per 17-byte block instead of 17 byte loads (stacked tensors of a multiple of 4 bytes; its
# row offsets stay in bytes).
VARIANTS = {"Q4_K": (gk.Q4_K_WIDE, 4, 8), "Q6_K": (gk.Q6_K_WORDS, 4, 4),
            "MXFP4": (ek.MXFP4_WORDS, 1, 4)}


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


class _Launch(NamedTuple):
    """What moe_gemv_kernel and moe_down_kernel launches share for weights wt and input x."""
    config: MoeConfig
    fmt_id: int
    items: int
    words: object           # the weights as the kernel reads them (a view of wt.words)
    row_words: int          # one row, in the kernel's offset unit (MXFP4_WORDS: bytes)
    x_type: type            # the input's element type: u32 Q8_1 words or f32
    act: int                # ek.ACT_Q8 / ek.ACT_F32
    x_words: int            # one input row, in elements of x_type
    x_flat: np.ndarray      # the input as a flat view of x_type
    groups: int             # row groups of warps * rows_per_warp rows (the grid's x)


def _launch(wt: ExpertWeights, x, config: MoeConfig | None, down: bool = False) -> _Launch:
    c = config or default_config()
    q8 = _q8(wt)
    x_type, act = (np.uint32, ek.ACT_Q8) if q8 else (np.float32, ek.ACT_F32)
    x_words = q8_1_bytes(wt.n) // 4 if q8 else wt.n
    x_flat = x.reshape(-1).view(x_type)
    fmt_id, items, words, row_words = _weights_spec(wt, x_flat, x_words * 4, q8)
    per_block = c.warps * (c.down_rows if down else c.rows)
    groups = (wt.rows + per_block - 1) // per_block
    return _Launch(c, fmt_id, items, words, row_words, x_type, act, x_words, x_flat, groups)


def _weights_spec(wt: ExpertWeights, x_flat, x_row_bytes: int, q8: bool):
    """(FMT id, items per block, weight words as read, row length in their offset unit): a
    VARIANTS kernel where it applies, else the format's base kernel."""
    fmt = get_format(wt.type_name)
    row_bytes = _blocks(wt) * fmt.block_bytes
    base = (fmt.id, Q8_1_TYPES[wt.type_name] if q8 else 1, wt.words,
            row_bytes // wt.words.dtype.itemsize)
    if not q8 or wt.type_name not in VARIANTS:
        return base
    fmt_id, items, align = VARIANTS[wt.type_name]
    if x_flat.ptr % align or x_row_bytes % align or wt.words.nbytes % 4 or \
            (wt.type_name == "Q6_K" and _blocks(wt) % 2):
        return base
    return (fmt_id, items, wt.words.view(np.uint32),
            row_bytes if fmt_id == ek.MXFP4_WORDS else row_bytes // 4)


def _blocks(wt: ExpertWeights) -> int:
    return wt.n // get_format(wt.type_name).block_elems


def glu_into(gate: ExpertWeights, up: ExpertWeights, x, h, ids, tiles, units: int,
             x_div: int, act: str, gate_bias=None, up_bias=None, tiled: bool = False,
             config: MoeConfig | None = None, stream=None, hq=None) -> None:
    """h rows = act(gate_e x + bg, up_e x + bu) (moe_gemv_kernel): per pair (units pairs,
    input row pair // x_div) or per tile (units tiles). x: Q8_1 words or f32 rows as the
    type needs (_q8). hq (pairs only, where fused_q8_1_applies): h's rows written as Q8_1
    rows into hq (uint8 (units, q8_1_bytes(rows))) instead of f32 rows into h."""
    if gate.type_name != up.type_name or gate[2:] != up[2:]:
        raise ValueError("moe: gate and up experts must have the same type and shape")
    if act not in ACTS:
        raise ValueError(f"moe: act must be one of {', '.join(ACTS)}, got {act!r}")
    units_into(gate, up, x, h, ids, tiles, units, x_div, ACTS[act], gate_bias, up_bias, tiled,
          config, stream, hq)


def fused_q8_1_applies(w: ExpertWeights, config: MoeConfig | None, tiled: bool) -> bool:
    """Whether the pairs' GEMV can write its rows as Q8_1 (moe_gemv_kernel's QOUT): blocks
    of 32 // rows warps then hold 32 rows each."""
    c = config or default_config()
    return not tiled and 32 % c.rows == 0 and w.rows % 32 == 0


def units_into(w, w2, x, y, ids, tiles, units, x_div, glu, bias, bias2, tiled, config, stream,
               hq=None):
    """Launch moe_gemv_kernel over `units` pairs or tiles (expert_kernels.py); glu an
    expert_kernels.GLU_* value; hq: glu_into's."""
    p = _launch(w, x, config)
    c = p.config
    has_bias = bias is not None
    w2_words = _launch(w2, x, config).words
    warps, groups = c.warps, p.groups
    if hq is not None:
        if not fused_q8_1_applies(w, c, tiled) or hq.nbytes < units * q8_1_bytes(w.rows):
            raise ValueError(f"moe: Q8_1 output needs pairs, rows ({w.rows}) and 32 a "
                             f"multiple of rows per warp ({c.rows}), and hq of {units} rows "
                             f"of {q8_1_bytes(w.rows)} bytes (got {hq.nbytes} bytes)")
        warps, groups = 32 // c.rows, w.rows // 32
    ek.moe_gemv_kernel[(groups, units), warps * 32, stream](
        p.words, w2_words, p.x_flat, bias if has_bias else y, bias2 if bias2 is not None else y,
        ids, tiles, y, y.reshape(-1).view(np.uint32) if hq is None else
        hq.reshape(-1).view(np.uint32), w.rows, p.row_words, _blocks(w), w.n, p.x_words, x_div,
        p.fmt_id, p.words.dtype, p.x_type, p.act, p.items, warps, c.rows,
        c.batch if tiled else 1, glu, has_bias, tiled, hq is not None)


def down_into(down: ExpertWeights, h, y, ids, route_w, tokens: int, k: int, bias=None,
              res=None, config: MoeConfig | None = None, stream=None) -> None:
    """y (tokens, rows) = (res +) sum_j route_w[t, j] (down_e h[t k + j] + b_e)
    (moe_down_kernel); h: Q8_1 words or f32 rows as the type needs (_q8)."""
    p = _launch(down, h, config, down=True)
    c = p.config
    ek.moe_down_kernel[(p.groups, tokens), c.warps * 32, stream](
        p.words, p.x_flat, y if bias is None else bias, ids, route_w,
        y if res is None else res, y, down.rows, p.row_words, _blocks(down), down.n,
        p.x_words, p.fmt_id, p.words.dtype, p.x_type, p.act, p.items, c.warps, c.down_rows, k,
        bias is not None,
        res is not None)
