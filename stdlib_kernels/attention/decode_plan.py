"""Decode attention's host-side planning: the kernel configuration and the split counts.

Input: the GQA group, head size, cache dtype, device and the visible key counts of a launch.
Output: a `DecodeConfig` (which kernel: SIMT decode_partial, tensor-core decode_mma or
decode_bulk, and its compile-time shape) and split counts for one launch (`config_splits`) or
a batch of sequences (`batch_splits`). decode.py launches what these choose.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

import pykernel as pk

from .decode_bulk import TILE as BULK_TILE
from .decode_combine import MAX_SPLITS
from .kv_q8 import DTYPE as Q8_DTYPE
from ..options import KernelOptions, env_options

STAGES = 2                   # ring depth of gpu_config: deeper rings measured no faster
MIN_KEYS_PER_SPLIT = 8       # below this a split's fixed cost outweighs its parallelism
MAX_HEADS_PER_BLOCK = 4      # query heads sharing one block's K/V reads: more would cut the
                             # blocks per SM that BLOCKS_PER_SM assumes (registers)
SHARED_LIMIT = 48 * 1024     # static shared memory of the cross-warp merge


@dataclass(frozen=True)
class DecodeConfig:
    """Compile-time shape of decode_partial (see decode_kernels' docstring)."""
    heads_per_block: int     # GB
    warps: int = 4           # NWARPS
    unroll: int = 2          # U: keys per row group per stage (gpu_config: 1 for f16, 2 f32;
                             # each costs ~20 registers, i.e. blocks per SM)
    lanes: int = 32          # at most this many lanes share one key row (fewer: less shuffling)
    stages: int = 2          # P: stages in the register ring (P - 1 in flight while one scores)
    mma: bool = False        # decode_mma (tensor cores, f16 cache, D % 32 == 0): heads_per_block
                             # <= 8, 16 keys per warp per stage; U, lanes unused
    blocks_per_sm: int = 4   # the split planner's target of resident blocks per multiprocessor
    early_trigger: bool = False  # GPU: let the next kernel of a PDL graph launch at block start
                                 # (only when the grid is one wave)
    bulk: bool = False       # decode_bulk (mma with K/V brought into shared memory by bulk
                             # copies; f16 cache, sm_90+ or the CPU target): stages = S tiles
                             # per warp in shared memory, warps <= BULK_MAX_WARPS




def heads_per_block(group: int, limit: int = MAX_HEADS_PER_BLOCK) -> int:
    """Largest divisor of the GQA group size up to `limit` (the SIMT kernel's register
    budget, or the tensor-core kernels' 8 mma columns)."""
    return max(d for d in range(1, min(group, limit) + 1) if group % d == 0)


MMA_MAX_HEADS = 8            # decode_mma: the block's heads are the 8 columns of an mma tile


def mma_config(group: int, head_dim: int = 128, warps: int = 8, stages: int | None = None,
               blocks_per_sm: int = 1) -> DecodeConfig:
    """decode_mma's shape. Default: 8 warps, a ring of 2 tiles (242 registers at head_dim 128,
    so one block per SM; 1 stage above 128, where 2 would spill) and splits for one block per
    SM: the fastest or within 2% of it at 1k-32k keys on the H200 (benchmarks/RESULTS.md)."""
    gb = heads_per_block(group, MMA_MAX_HEADS)
    stages = stages or (2 if head_dim <= 128 else 1)
    return DecodeConfig(heads_per_block=gb, warps=warps, stages=stages, mma=True,
                        blocks_per_sm=blocks_per_sm)


BULK_MAX_WARPS = 4           # decode_bulk's launch bounds: 128 threads, three blocks per SM


def bulk_config(group: int, head_dim: int = 128, warps: int = BULK_MAX_WARPS, stages: int = 2,
                blocks_per_sm: int = 2) -> DecodeConfig:
    """decode_bulk's shape: the GQA group's heads (up to 8) per block, `stages` 16-key tiles
    per warp in shared memory (2 x 8 KB per warp at head_dim 128), splits for blocks_per_sm
    blocks per SM: two of the three that fit, so the next decode's blocks of a PDL chain find
    room and start their copies while this one streams."""
    gb = heads_per_block(group, MMA_MAX_HEADS)
    return DecodeConfig(heads_per_block=gb, warps=warps, stages=stages, mma=True, bulk=True,
                        blocks_per_sm=blocks_per_sm, early_trigger=True)


def bulk_shared_bytes(config: DecodeConfig, head_dim: int) -> int:
    """decode_bulk's dynamic shared memory: warps x stages x (K + V) x 16 rows of f16."""
    return config.warps * config.stages * 2 * BULK_TILE * head_dim * 2


def direct_config(config: DecodeConfig) -> DecodeConfig:
    """The tensor-core kernel's shape for a launch without splits (a short context, as in the
    runner's short-context decode graph): one query head per block. A one-split launch is a
    latency chain (length, a few tiles, the warps' merge) run by one block per head group, so
    more blocks cost nothing. H200, tg128 from an empty context: llama-8B 524.7 -> 532.6,
    qwen2-1.5B 981 -> 1029 (2 blocks of 6 heads before; measured when one head per block was
    also what let the block write its Q8_1 output itself); benchmarks/RESULTS.md, "One query
    head per block without splits"."""
    if config.bulk:          # one split: decode_mma's direct launch (bulk: head_dim <= 128)
        config = dataclasses.replace(config, bulk=False, warps=8, stages=2, blocks_per_sm=1)
    return dataclasses.replace(config, heads_per_block=1) if config.mma else config


def cuda_sm(device=None) -> int:
    """The compute capability of a cuda device as one number (sm_90: 90); 0 elsewhere."""
    device = device or pk.current_device()
    arch = getattr(device, "arch", "")
    return int(arch[3:]) if device.kind == "cuda" and arch.startswith("sm_") else 0


def bulk_capable(head_dim: int, device=None) -> bool:
    """decode_bulk's bulk copies need sm_90+; above head_dim 128 its registers spill."""
    return head_dim <= 128 and cuda_sm(device) >= 90


def mma_capable(head_dim: int, dtype, device=None) -> bool:
    """decode_mma handles f16 caches with head_dim a multiple of 32 on sm_80+."""
    return np.dtype(dtype) == np.float16 and head_dim % 32 == 0 and cuda_sm(device) >= 80


def default_config(group: int, head_dim: int, device=None, dtype=np.float16,
                   options: KernelOptions | None = None) -> DecodeConfig:
    """CPU target: the smallest kernel (compile time of unrolled code dominates there).
    GPU: tensor cores where decode_mma applies (f16 cache; options.decode_mma), on decode_bulk
    where options.decode_bulk asks and it applies, else the SIMT kernel."""
    device = device or pk.current_device()
    options = options or env_options()
    if isinstance(dtype, str) and dtype == Q8_DTYPE:      # only the tensor-core kernel reads it
        return mma_config(group, head_dim, warps=2 if device.kind == "cpu" else 8)
    if device.kind == "cpu":
        return DecodeConfig(heads_per_block=1, warps=2, unroll=1)
    if options.decode_mma and mma_capable(head_dim, dtype, device):
        if options.decode_bulk and bulk_capable(head_dim, device):
            return bulk_config(group, head_dim, stages=1)
        return mma_config(group, head_dim)
    return gpu_config(group, head_dim, dtype)


def shared_bytes(config: DecodeConfig, head_dim: int) -> int:
    """Static shared memory of decode_partial with FUSED (the larger form): the cross-warp
    merge buffers plus the last block's combine buffers."""
    gb, threads = config.heads_per_block, 32 * config.warps
    merge = (config.warps * gb * (head_dim + 2)) * 4
    return merge + (gb * MAX_SPLITS + gb + threads * 4) * 4 + 4


def gpu_config(group: int, head_dim: int, dtype=np.float16) -> DecodeConfig:
    """Up to 4 heads per block, 4 warps (fewer if shared memory would overflow), a ring of
    STAGES stages of one key per row group (f16) or two (f32: half the rows per warp, so the
    per-stage softmax work is spread over as many keys) (benchmarks/RESULTS.md, "Attention")."""
    gb = heads_per_block(group)
    unroll = 1 if np.dtype(dtype) == np.float16 else 2
    config = DecodeConfig(heads_per_block=gb, warps=4, unroll=unroll, stages=STAGES)
    while config.warps > 1 and shared_bytes(config, head_dim) > SHARED_LIMIT:
        config = DecodeConfig(gb, config.warps // 2, config.unroll, stages=config.stages)
    return config


def multiprocessors(device=None) -> int:
    device = device or pk.current_device()
    core = getattr(device, "core", None)
    if core is not None:
        return int(core.properties.multiprocessor_count)
    return 2  # cpu target: few splits keep the coroutine scheduler fast


BLOCKS_PER_SM = 4            # split blocks per multiprocessor (benchmarks/RESULTS.md)


def plan_splits(max_kv_len: int, blocks_per_split: int, device=None,
                blocks_per_sm: int = BLOCKS_PER_SM) -> int:
    """Splits for a key range of up to max_kv_len: as many blocks as fit blocks_per_sm per
    multiprocessor in one wave (rounded down: a few blocks of a second wave would double the
    time), but no split shorter than MIN_KEYS_PER_SPLIT keys."""
    target = blocks_per_sm * multiprocessors(device)
    wanted = max(1, target // max(1, blocks_per_split))
    return max(1, min(wanted, math.ceil(max_kv_len / MIN_KEYS_PER_SPLIT), MAX_SPLITS))


def config_splits(config: DecodeConfig, n_head: int, n_kv_head: int, max_kv_len: int,
                  device=None) -> int:
    """plan_splits for `config`'s blocks per split and blocks per multiprocessor."""
    blocks = n_kv_head * (n_head // n_kv_head // config.heads_per_block)
    return plan_splits(max_kv_len, blocks, device, config.blocks_per_sm)


# The batch planner's model of one split block (decode_mma, fitted to an H100's batched 8B
# decode, benchmarks/RESULTS.md "Batched decode: attention splits for the whole batch, ..."):
# a fixed cost, then its keys at one block's streaming rate
SPLIT_BLOCK_US = 3.0
BLOCK_BYTES_PER_US = 21e3      # 21 GB/s


def batch_splits(kv_lens, config: DecodeConfig, n_head: int, n_kv_head: int, head_dim: int,
                 itemsize: int, device=None) -> int:
    """Splits for one launch over sequences of these visible key counts (every sequence's
    range cut into that many parts): the power of two, up to the one-sequence plan of the
    longest, with the least modelled time max(all blocks' work over the multiprocessors' block
    slots, the longest block). One sequence's splits fill the GPU by themselves; 16 sequences
    planned that way ran 16 waves of short blocks (the 8B at 512 keys each: 60 us a layer,
    15 with one split), while one long sequence among short ones still needs its splits."""
    lens = np.maximum(np.asarray(kv_lens, np.int64).reshape(-1), 1)
    blocks = n_kv_head * (n_head // n_kv_head // config.heads_per_block)
    most = plan_splits(int(lens.max()), blocks, device, config.blocks_per_sm)
    slots = multiprocessors(device) * config.blocks_per_sm
    key_us = 2 * head_dim * itemsize / BLOCK_BYTES_PER_US     # one key's K and V row

    def modelled(splits: int) -> float:
        work = blocks * (len(lens) * splits * SPLIT_BLOCK_US + int(lens.sum()) * key_us)
        return max(work / slots, SPLIT_BLOCK_US + int(lens.max()) / splits * key_us)
    powers = [1 << i for i in range(most.bit_length()) if 1 << i <= most]
    return min(powers, key=lambda splits: (modelled(splits), splits))
