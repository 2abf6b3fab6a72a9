"""A GGUF file's tensors as one tensor-parallel rank sees them.

Input: a `GGUFFile`, its full `ModelConfig`, the `ArchSpec`, a `ShardPlan` and a rank. Output:
`ShardedFile`, which answers what `llm.models.weights.load_weights` asks of a file (`path`,
`tensors`, `tensor(name)`) with the rank's slices under the tensors' own names (so errors and
backends name the real tensor), shaped for `plan.local_config`:
    attn_q / k / v (and attn_qkv), ffn_gate / up   rows of the rank's heads / FFN columns
    attn_output, ffn_down                          columns, in whole quant blocks per row
    attn_output.bias, ffn_down.bias                rank 0 only (added once, before the sum)
    token_embd, output                             the rank's vocabulary rows + one zero row
    attn_sinks                                     the rank's heads
    norms, q/k norms, rope_freqs, position_embd    whole
Row slices of the memory map are views; column slices and the zero row are copies.
"""
from __future__ import annotations

import re

import numpy as np
from gguf.constants import GGML_QUANT_SIZES

from llm.config import ModelConfig
from llm.gguf_file import GGUFError, GGUFFile, TensorInfo
from llm.parallel.plan import RankShard, ShardPlan, Span, column_block_range

_BLOCK = re.compile(r"blk\.\d+\.(.+)$")
_ROW_PARALLEL_BIASES = ("attn_output.bias", "ffn_down.bias")


def _row_bytes(t: TensorInfo) -> int:
    block, block_bytes = GGML_QUANT_SIZES[t.ggml_type]
    return t.shape[-1] // block * block_bytes


def take_rows(t: TensorInfo, spans: list[Span], unit: int, pad_rows: int = 0) -> TensorInfo:
    """Rows [first * unit, stop * unit) of each span, stacked (a 1-D tensor: its elements),
    then `pad_rows` rows of zero bytes (zero in every GGUF type: all scales 0)."""
    rows = t.shape[0]
    width = _row_bytes(t) if len(t.shape) > 1 else GGML_QUANT_SIZES[t.ggml_type][1]
    if len(t.shape) == 1 and GGML_QUANT_SIZES[t.ggml_type][0] != 1:
        raise GGUFError("tensor parallelism", f"tensor {t.name!r}", "a quantized vector cannot "
                        "be split by element")
    table = np.asarray(t.data).reshape(rows, width)
    pieces = [table[s.first * unit:s.stop * unit] for s in spans]
    if pad_rows:
        pieces.append(np.zeros((pad_rows, width), np.uint8))
    data = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
    n = data.shape[0]
    return TensorInfo(t.name, t.ggml_type, (n,) + tuple(t.shape[1:]), t.offset, data.size,
                      data.reshape(-1))


def take_columns(t: TensorInfo, cols: Span) -> TensorInfo:
    """Columns `cols` of every row of a 2-D tensor, in whole quant blocks (ShardingError naming
    the tensor where a block would be cut)."""
    block, block_bytes = GGML_QUANT_SIZES[t.ggml_type]
    blocks = column_block_range(t.name, t.ggml_type.name, block, t.shape[1], cols)
    table = np.asarray(t.data).reshape(t.shape[0], _row_bytes(t))
    data = np.ascontiguousarray(table[:, blocks.first * block_bytes:blocks.stop * block_bytes])
    return TensorInfo(t.name, t.ggml_type, (t.shape[0], cols.count), t.offset, data.size,
                      data.reshape(-1))


class ShardedFile:
    """The file as rank `shard.rank` of `plan` loads it (see the module docstring)."""

    def __init__(self, g: GGUFFile, cfg: ModelConfig, plan: ShardPlan, rank: int):
        self.g, self.path, self.cfg = g, g.path, cfg
        self.shard: RankShard = plan.ranks[rank]
        self.tensors: dict[str, TensorInfo] = {}
        for name, t in g.tensors.items():
            local = self._slice(name, t)
            if local is not None:
                self.tensors[name] = local

    def tensor(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise GGUFError(self.path, f"tensor {name!r}", "missing (required for this model)")
        return self.tensors[name]

    def _slice(self, name: str, t: TensorInfo) -> TensorInfo | None:
        s, cfg = self.shard, self.cfg
        if name in ("token_embd.weight", "output.weight"):
            return take_rows(t, [s.vocab], 1, pad_rows=1)
        match = _BLOCK.match(name)
        part = match.group(1) if match else ""
        if part in _ROW_PARALLEL_BIASES:
            return t if s.rank == 0 else None
        q, kv = s.q_heads, s.kv_heads
        if part.startswith("attn_q."):
            return take_rows(t, [q], cfg.head_dim)
        if part.startswith(("attn_k.", "attn_v.")):
            return take_rows(t, [kv], cfg.head_dim if "attn_k" in part else cfg.head_dim_v)
        if part.startswith("attn_qkv."):
            return self._qkv_rows(t)
        if part.startswith(("ffn_gate.", "ffn_up.")):
            return take_rows(t, [s.ff], 1)
        if part == "attn_output.weight":
            return take_columns(t, Span(q.first * cfg.head_dim_v, q.count * cfg.head_dim_v))
        if part == "ffn_down.weight":
            return take_columns(t, s.ff)
        if part == "attn_sinks.weight":
            return take_rows(t, [q], 1)
        return t     # norms, q/k norms, rope_freqs, position_embd: every rank holds them

    def _qkv_rows(self, t: TensorInfo) -> TensorInfo:
        """A fused q|k|v projection: the rank's rows of each of its three sections."""
        cfg, q, kv = self.cfg, self.shard.q_heads, self.shard.kv_heads
        q_rows, k_rows = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
        spans = [Span(q.first * cfg.head_dim, q.count * cfg.head_dim),
                 Span(q_rows + kv.first * cfg.head_dim, kv.count * cfg.head_dim),
                 Span(q_rows + k_rows + kv.first * cfg.head_dim_v, kv.count * cfg.head_dim_v)]
        return take_rows(t, spans, 1)
