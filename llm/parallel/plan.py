"""The tensor-parallel sharding plan: which heads, FFN columns and vocabulary rows each rank holds.

Input: a `ModelConfig` and a rank count N. Output: a `ShardPlan` (one `RankShard` per rank) and
the pure helpers the loader and the runner use with it: `local_config` (the config a rank's
transformer runs with), `column_block_range` (a row-parallel matrix's column slice in whole quant
blocks), `local_token_ids` (global ids -> a rank's vocabulary rows) and `reduce_argmax`.

Megatron-style split of one layer over N ranks:
    q, k, v, gate, up   column-parallel: rank r computes its heads' / FFN columns' outputs
                        (a slice of the matrix's rows; their biases sliced alike)
    attn_out, down      row-parallel: rank r multiplies its slice of the input columns; the
                        partial sums are all-reduced (a bias is added once, on rank 0)
    token_embd, output  split by vocabulary rows: a rank embeds the ids it holds (zero rows
                        for the others, then an all-reduce) and computes its logits' columns
GQA: query head h reads KV head h // group (group = n_head / n_head_kv). With n_head_kv
divisible by N, rank r holds KV heads [r * n_head_kv / N, (r + 1) * n_head_kv / N), each with
its whole group of query heads. With fewer KV heads than ranks (N divisible by n_head_kv), each
KV head is replicated on m = N / n_head_kv ranks: rank r holds KV head r // m and query heads
[r * n_head / N, (r + 1) * n_head / N), which all read that KV head (n_head / N divides the
group because N divides n_head). Any other combination is refused.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from llm.config import ModelConfig


class ShardingError(ValueError):
    """A model cannot be split over the requested number of ranks; says why and what would."""


@dataclass(frozen=True)
class Span:
    """Indices [first, first + count) of some axis (heads, FFN columns, vocabulary rows)."""
    first: int
    count: int

    @property
    def stop(self) -> int:
        return self.first + self.count


@dataclass(frozen=True)
class RankShard:
    rank: int
    q_heads: Span
    kv_heads: Span
    ff: Span          # FFN columns (gate/up rows, down columns)
    vocab: Span       # token_embd / output rows


@dataclass(frozen=True)
class ShardPlan:
    n_ranks: int
    kv_replicas: int          # ranks holding each KV head (1: KV heads split, not replicated)
    ranks: tuple[RankShard, ...]


def even_span(total: int, n_ranks: int, rank: int) -> Span:
    """Rank's share of `total` items in N contiguous pieces, the first `total % N` one longer."""
    base, extra = divmod(total, n_ranks)
    first = rank * base + min(rank, extra)
    return Span(first, base + (rank < extra))


def _kv_layout(cfg: ModelConfig, n_ranks: int) -> int:
    """KV replicas per head (1 when the KV heads split evenly), or ShardingError."""
    if cfg.n_head % n_ranks:
        raise ShardingError(f"tensor parallelism over {n_ranks} ranks needs the {cfg.n_head} "
                            f"attention heads to split evenly (n_head % tp == 0)")
    if cfg.n_head_kv % n_ranks == 0:
        return 1
    if n_ranks % cfg.n_head_kv == 0:
        return n_ranks // cfg.n_head_kv
    raise ShardingError(f"tensor parallelism over {n_ranks} ranks needs the {cfg.n_head_kv} KV "
                        f"heads to split evenly or to divide {n_ranks} (each then replicated)")


def plan_shards(cfg: ModelConfig, n_ranks: int) -> ShardPlan:
    """The plan for N ranks, or ShardingError where the model does not split that way."""
    if n_ranks < 1:
        raise ShardingError(f"the tensor-parallel size must be at least 1, got {n_ranks}")
    if cfg.moe is not None and n_ranks > 1:
        raise ShardingError(f"{cfg.arch} is a mixture of experts; tensor parallelism splits "
                            f"dense FFNs only (run it with tp=1)")
    replicas = _kv_layout(cfg, n_ranks)
    if cfg.n_ff % n_ranks:
        raise ShardingError(f"tensor parallelism over {n_ranks} ranks needs the FFN width "
                            f"{cfg.n_ff} to split evenly (n_ff % tp == 0)")
    heads, ff = cfg.n_head // n_ranks, cfg.n_ff // n_ranks
    kv = 1 if replicas > 1 else cfg.n_head_kv // n_ranks
    ranks = tuple(RankShard(
        rank=r, q_heads=Span(r * heads, heads),
        kv_heads=Span(r // replicas if replicas > 1 else r * kv, kv),
        ff=Span(r * ff, ff), vocab=even_span(cfg.n_vocab, n_ranks, r))
        for r in range(n_ranks))
    return ShardPlan(n_ranks, replicas, ranks)


def local_config(cfg: ModelConfig, shard: RankShard) -> ModelConfig:
    """The config of one rank's transformer: its heads, FFN columns and vocabulary rows, plus
    one zero row of the vocabulary (`local_token_ids` maps ids other ranks hold to it; its
    logit column is dropped when the logits are gathered)."""
    return dataclasses.replace(cfg, n_head=shard.q_heads.count, n_head_kv=shard.kv_heads.count,
                               n_ff=shard.ff.count, n_vocab=shard.vocab.count + 1)


def column_block_range(name: str, type_name: str, block: int, n_cols: int,
                       cols: Span) -> Span:
    """The block indices of one row that hold columns `cols` of a row-parallel matrix with
    `block` values per quant block (1 for float types), or ShardingError naming the tensor:
    a rank must get whole blocks of every row."""
    if cols.first % block or cols.count % block:
        raise ShardingError(
            f"tensor {name!r} ({type_name}, {block}-value blocks): a rank's columns "
            f"{cols.first}..{cols.stop} of {n_cols} are not whole blocks; tensor parallelism "
            f"splits its input columns on block boundaries (use a smaller tp)")
    return Span(cols.first // block, cols.count // block)


def local_token_ids(ids: np.ndarray, vocab: Span) -> np.ndarray:
    """Global token ids -> rows of a rank's embedding shard: ids it holds map to id - first,
    the others to its zero row (index vocab.count), so an all-reduce of the ranks' rows is the
    full embedding."""
    ids = np.asarray(ids, np.int64)
    held = (ids >= vocab.first) & (ids < vocab.stop)
    return np.where(held, ids - vocab.first, vocab.count)


def reduce_argmax(values: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Each rank's row maxima and their global token ids, (n_ranks, rows) each -> every row's
    greedy token: the largest value, the lowest id on ties (what one argmax over the gathered
    row gives). NaN never wins; a row whose largest value is not finite (all NaN, only -Inf,
    or +Inf: broken weights) gets -1, as the kernels backend's device argmax marks it
    (sampling.check_device_picks turns it into NonFiniteLogitsError)."""
    values = np.where(np.isnan(values), -np.inf, values)
    best = values.max(axis=0, keepdims=True)
    ids = np.where(values == best, indices, np.iinfo(np.int64).max).min(axis=0)
    return np.where(np.isfinite(best[0]), ids, -1)
