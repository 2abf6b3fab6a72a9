"""Int8 tensor-core prefill GEMM per 256-value K step (Q4_K, Q5_K, Q6_K; Q4_0, Q8_0, Q4_1, Q5_0,
Q5_1 when K % 256 == 0), host side: tile shapes per type and prompt length, the split-K plan and
its workspaces, and the launch.
Y[t, r] = sum_k W[r, k] X[t, k].

    gemm_q8k_into(w, type, xq, y, rows, K, tokens, tiles=None)   xq = Q8_1 rows (q8_1.py)

The kernel and its arithmetic: gemm_q8_k_kernels.py; its shared-memory parts: gemm_q8_k_parts.py.
Split-K (split > 1, auto_split by default on a GPU): grid z splits the K steps; each block
writes its fragments to a per-stream workspace and the last block of a tile (a counter per
tile) adds them in split order and stores C: deterministic whatever the blocks' timing.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

import pykernel as pk

from .. import _launch as L
from .formats import FORMATS, GEMM_Q8_K, QK_K, type_ids
from .gemm import output_args
from .gemv import word_dtype
from .gemm_q8_k_kernels import gemm_q8k_kernel
from .gemm_q8_k_parts import STEP_WORDS, a_stride, shared_bytes, stage_words
from .q8_1 import q8_1_bytes


# type name -> ggml id (formats.py): the K-quants, and the 32-value formats (8 blocks per K
# step of 256) when K % 256 == 0
SUPERBLOCK_GEMM_TYPES = type_ids(GEMM_Q8_K)
KQUANT_GEMM_TYPES = {t: i for t, i in SUPERBLOCK_GEMM_TYPES.items()
                     if FORMATS[t].block_elems == QK_K}
STEP_BYTES = {t: FORMATS[t].superblock_bytes for t in SUPERBLOCK_GEMM_TYPES}   # one row, K step


class Q8KTiles(NamedTuple):
    mi: int = 4      # m16 tiles per warp (weight rows)
    ni: int = 4      # n8 tiles per warp (tokens)
    wm: int = 2      # warps along rows
    wn: int = 4      # warps along tokens
    stages: int = 3  # shared-memory stages, 3..8 (the scale pass runs one step ahead)

    @property
    def shape(self) -> tuple[int, int]:
        return 16 * self.mi * self.wm, 8 * self.ni * self.wn


# fastest shapes of the sweeps on the H200 (benchmarks/RESULTS.md): Q4_K 311 us at m=4096 n=512
# k=14336 with 128 x 128 tiles of 8 warps (64 x 32 warp tiles; since the min term went to the
# tensor cores, ahead of 16 warps of 64 x 16 on all three 8B prefill shapes); Q6_K 499 us with
# 32 x 64 warp tiles. (Q6_K with its fragment shifts as constants per step parity, two copies
# of the step: -3..5% at k = 14336 and 4096 x 4096, +17% at 14336 x 4096: not kept.)
# (Q8_0 had 96 x 128 tiles while its scale pass ran: 433 -> 394 us at the down projection
# against 64 x 128, H100, RESULTS.md "Q8_0 and Q6_K files side by side".)
TUNED_KTILES = {"Q4_K": Q8KTiles(4, 4, 2, 4, 3), "Q6_K": Q8KTiles(2, 8, 4, 2, 3),
                "Q5_K": Q8KTiles(4, 4, 2, 4, 3)}
# The 32-value formats, swept again once their scale pass had gone (H100, 2026-11-27;
# benchmarks/RESULTS.md "The int8 GEMM without its scale pass"): fastest with Q6_K's 32 x 64
# warp tiles (over the 8B's three GEMMs, layer-weighted, against the 64 x 32 before: Q4_0
# -4.9%, Q4_1 -1.3%, Q5_1 -14.1%; Q5_0 had them already); Q8_0's 128 x 128 fit once the
# unused scale buffers were no longer allocated (-7.5% against its 128 x 64 of 32 x 32 per
# warp; RESULTS.md "Q8_0 on 128 x 128 tiles"). A fourth stage: Q4_0 -0.7% (not kept).
TUNED_KTILES.update({t: Q8KTiles(2, 8, 4, 2, 3) for t in ("Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                                            "Q8_0")})
CPU_KTILES = Q8KTiles(1, 1, 1, 1, 3)       # 16 x 8, one warp: the CPU target emulates threads
# short prompts: (at most this many tokens, tiles), tried in order before TUNED_KTILES. A
# 128 x 128 tile leaves most multiprocessors idle below ~256 tokens (llama-8B's down
# projection: 32 blocks) and pays for 128 token columns however few are real; narrower and
# shorter tiles made a 16-token 8B prefill 2.6x faster on the H200, 128 tokens 1.4x
# (benchmarks/short_prompts.py, RESULTS.md "Short prompts"; Q4_0 gains alike; Q8_0, whose
# tuned tiles were 64 x 128 then, only up to 64 tokens: the 8B's four GEMMs 889 -> 204 us at 16).
# 33-48 tokens: one 128 x 48 tile (wide_tiles' rule; H100, prompts of 33 / 40 / 48 tokens:
# llama-8B +20-23%, qwen2-1.5B +7-10%); 49-64: 64 x 64 (128 x 64 measured +4-6% on the 8B but
# -2.5-4% on qwen2-1.5B); up to 8 tokens (batched decode of 6-8 sequences): 64 x 8 (H100,
# the 8B's GEMMs at 8 tokens against 64 x 16: gate|up 56.2 -> 46.2 us, down Q4_K 36.5 ->
# 30.5, down Q6_K 45.6 -> 40.0; RESULTS.md "Batched decode GEMVs")
_SMALL = [(8, Q8KTiles(1, 1, 4, 1, 3)), (16, Q8KTiles(1, 2, 4, 1, 3)),
          (32, Q8KTiles(1, 4, 4, 1, 3)), (48, Q8KTiles(2, 3, 4, 2, 3)),
          (64, Q8KTiles(1, 4, 4, 2, 3))]
SMALL_KTILES: dict[str, list[tuple[int, Q8KTiles]]] = {
    "Q4_K": _SMALL, "Q6_K": _SMALL, "Q4_0": _SMALL, "Q4_1": _SMALL, "Q5_0": _SMALL,
    "Q5_1": _SMALL, "Q5_K": _SMALL, "Q8_0": _SMALL[:3] + [(64, Q8KTiles(1, 4, 4, 2, 3))]}
# 65-256 tokens (every type; Q8_0 since its 128-row tiles fit, RESULTS.md "Q8_0 on 128 x 128
# tiles": 128 / 256 tokens +0.3 / +1.2% against its tuned tiles): 128 weight rows x as few
# token columns as cover the tokens in ceil(tokens / 128) tiles, in steps of 16 (32 x 8 ni
# warp tiles, 8 warps); K split by auto_split. The GEMM's time follows the token columns it
# computes, so 72 tokens take a 128 x 80 tile rather than 128 x 128 (the 8B's GEMMs of a
# layer on an H100 at 72 / 128 / 256 tokens: 545 / 544 / 863 us with the tiles used before,
# 64 x 64 up to 128 tokens and 128 x 64 after, 435 / 439 / 742 with 128 x 128;
# benchmarks/small_gemm.py, RESULTS.md "Prompts of 65-256 tokens")
WIDE_TYPES = tuple(SUPERBLOCK_GEMM_TYPES)
WIDE_MAX = 256


def wide_tiles(tokens: int) -> Q8KTiles:
    """128 rows x the fewest 16-column steps that cover `tokens` in ceil(tokens / 128) tiles."""
    per_tile = -(-tokens // -(-tokens // 128))
    return Q8KTiles(2, -(-per_tile // 16), 4, 2, 3)


def tuned_tiles(type_name: str, tokens: int) -> Q8KTiles:
    for most, tiles in SMALL_KTILES.get(type_name, ()):
        if tokens <= most:
            return tiles
    if type_name in WIDE_TYPES and tokens <= WIDE_MAX:
        return wide_tiles(tokens)
    return TUNED_KTILES[type_name]


def kquant_tiles_ok(t: Q8KTiles) -> bool:
    return 3 <= t.stages <= 8 and min(t) >= 1


def gemm_q8k_into(w, type_name: str, xq, y, rows: int, K: int, tokens: int, stream=None,
                  tiles: Q8KTiles | None = None, *, ldy=None, col0: int = 0,
                  res=None, split: int | None = None) -> None:
    """y (tokens, rows) = X @ W^T, X as Q8_1 rows xq (tokens, q8_1_bytes(K)), w from
    gemv.weight_words (16-byte aligned), xq 16-byte aligned. No host sync.
    ldy / col0 / res: C goes to columns col0.. of y (tokens, ldy), plus res
    (gemm.output_args). split: K split over that many blocks per output tile (default on a
    GPU: auto_split, 1 on the CPU target); the partial tiles go to a per-stream workspace,
    allocated by the first call that needs it (so make that call before a graph capture)."""
    if type_name not in SUPERBLOCK_GEMM_TYPES:
        raise ValueError(f"gemm_q8k: no super-block int8 GEMM for {type_name}; supported: "
                         f"{sorted(SUPERBLOCK_GEMM_TYPES)}")
    if K <= 0 or K % 256:
        raise ValueError(f"gemm_q8k {type_name}: K = {K} must be a positive multiple of 256")
    ld, rv, has_res = output_args(y, rows, tokens, ldy, col0, res, "gemm_q8k")
    if xq.nbytes != tokens * q8_1_bytes(K):
        raise ValueError(f"gemm_q8k: Q8_1 activations must hold {tokens} x {q8_1_bytes(K)} "
                         f"bytes, got {xq.nbytes}")
    if w.ptr % 16 or xq.ptr % 16:
        raise ValueError("gemm_q8k: weights and Q8_1 activations must be 16-byte aligned")
    row_bytes = K // 256 * STEP_BYTES[type_name]
    if w.dtype != word_dtype(type_name) or w.nbytes < rows * row_bytes:
        raise ValueError(f"gemm_q8k {type_name}: weights must be {np.dtype(word_dtype(type_name))}"
                         f" words of {rows} rows x {row_bytes} bytes (gemv.weight_words), got "
                         f"{w.dtype} {w.nbytes} bytes")
    device = pk.current_device()
    gpu = device.kind != "cpu"
    t = tiles or (tuned_tiles(type_name, tokens) if gpu else CPU_KTILES)
    if not kquant_tiles_ok(t):
        raise ValueError(f"gemm_q8k: bad tiles {t} (stages must be 3..8)")
    fmt = SUPERBLOCK_GEMM_TYPES[type_name]
    bm, bn = t.shape
    if type_name in ("Q4_0", "Q8_0", "Q5_0"):   # K % 256 == 0: rows and K steps 16-byte aligned
        w = w.reshape(-1)[:rows * row_bytes // 2].view(np.uint32)
    row_words = row_bytes // w.itemsize
    words = xq.reshape(-1).view(np.uint32) if xq.dtype != np.uint32 else xq.reshape(-1)
    grid = ((rows + bm - 1) // bm, (tokens + bn - 1) // bn)
    dyn, threads = block_resources(fmt, t)
    split, part, counters = _split_plan(device, stream, grid[0] * grid[1], bm * bn, K // 256,
                                        split, (dyn, threads))
    spec = (("FMT", fmt), ("WT", w.dtype), ("GPU", int(gpu)), ("MI", t.mi), ("NI", t.ni),
            ("WM", t.wm), ("WN", t.wn), ("STAGES", t.stages), ("HAS_RES", has_res),
            ("SPLIT", split), ("AS", a_stride(fmt)), ("AW", STEP_WORDS.get(fmt, 0)))
    part = y if part is None else part          # unsplit launches never touch it
    # launch bounds (one block per SM): ptxas may use up to 65536 / threads registers
    L.launch(gemm_q8k_kernel, (*grid, split), threads,
             (w, words, y, ld, col0, rv, rows, row_words, K, tokens, part, counters), spec,
             stream, dyn, bounds=(threads, 1) if gpu else None)


# split-K: a launch of few output tiles splits K over blocks. A short prompt's GEMM otherwise
# runs a few warps per multiprocessor, too few loads in flight to stream its weights
# (llama-8B's down projection at 16 tokens: 64 tiles, 99 -> 29 us with 4 splits on an H200;
# benchmarks/small_gemm.py, RESULTS.md "Short prompts: split-K"); a launch of 128-row tiles
# whose count is not a whole number of waves splits where that packs the work into fewer
# waves (auto_split)
SPLIT_BLOCKS = 2
MAX_SPLIT = 8
MIN_SPLIT_STEPS = 2      # K steps per split at least
SPLIT_FILL_STEPS = 2     # a block's fixed cost in K steps (filling the stages, the epilogue)


def block_resources(fmt: int, t: Q8KTiles) -> tuple[int, int]:
    """(dynamic shared bytes, threads) of one block of tiles t."""
    return shared_bytes(fmt, *t.shape, t.stages), 32 * t.wm * t.wn


def launch_split(type_name: str, rows: int, K: int, tokens: int, t: Q8KTiles) -> int:
    """The split auto_split gives a GPU launch of tiles t (what gemm_q8k_into uses when
    split is None): for benchmarks that time the library's choice beside others."""
    bm, bn = t.shape
    per_sm = L.blocks_per_multiprocessor(*block_resources(SUPERBLOCK_GEMM_TYPES[type_name], t))
    return auto_split(-(-rows // bm) * -(-tokens // bn), K // 256, per_sm)


def auto_split(tiles: int, steps: int, per_sm: int = 1) -> int:
    """K splits for a launch of `tiles` output tiles over `steps` K steps, whose blocks fit
    `per_sm` to a multiprocessor.

    Several to an SM (short prompts' small tiles): about SPLIT_BLOCKS blocks per SM, so
    that enough loads are in flight. One to an SM (128-row tiles) and fewer than two waves of
    tiles: the split with the least modelled time, waves x (steps per split +
    SPLIT_FILL_STEPS), the blocks of a wave running side by side (a last, partly filled wave
    costs less than that when the GEMM streams its weights, so near ties favour splitting).
    Fitted to an H100 (benchmarks/small_gemm.py, RESULTS.md "K splits by waves"): Q8_0 at
    K = 14336 with 128 tiles took 246 / 261 / 272 / 299 us at 1 / 2 / 4 / 8 splits (the same
    waves per K step: the fill is the difference); qwen2-1.5B's q|k|v at
    512 tokens (56 tiles, 6 steps) 35.8 / 25.0 / 33.8 us at 1 / 2 / 3 splits."""
    sms = L.multiprocessors()
    most = max(1, min(steps // MIN_SPLIT_STEPS, MAX_SPLIT))
    if per_sm > 1:
        return max(1, min(round(SPLIT_BLOCKS * sms / tiles), most))
    if tiles >= 2 * sms:
        return 1      # waves enough: a split would add partial sums for little

    def modelled(split: int) -> float:
        return -(-tiles * split // sms) * (steps / split + SPLIT_FILL_STEPS)
    return min(range(1, most + 1), key=lambda split: (modelled(split), split))


_PLANS: dict = {}
_WORKSPACES: dict = {}


def _split_plan(device, stream, tiles: int, tile_values: int, steps: int, split, block):
    """(splits, partials or None, counters) of a launch of blocks of block = (shared bytes,
    threads); remembered per launch shape, since short prompts are bound by the host's time
    per launch."""
    key = (id(device), id(stream), tiles, tile_values, steps, split, block)
    plan = _PLANS.get(key)
    if plan is None:
        if split is None:
            split = 1 if device.kind == "cpu" else auto_split(
                tiles, steps, L.blocks_per_multiprocessor(*block))
        if not 1 <= split <= steps:
            raise ValueError(f"gemm_q8k: split {split} must be in 1..{steps} (K steps of 256)")
        if split > 1 and split * tiles * tile_values >= 1 << 31:   # 32-bit partial indices
            raise ValueError(f"gemm_q8k: {split} splits of {tiles} tiles need more than 2^31 "
                             f"partial values; use fewer splits")
        if split > 1:
            workspace = _WORKSPACES.get((id(device), id(stream)))
            if workspace is None:
                workspace = _WORKSPACES[id(device), id(stream)] = _SplitWorkspace(device, stream)
            plan = (split, *workspace.take(split * tiles * tile_values, tiles))
        else:
            plan = (1, None, L.zero_i32())
        if len(_PLANS) > 4096:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


class _SplitWorkspace:
    """Partials (f32) and tile counters (i32) of the split launches on one stream, which run
    one after another. The counters start at zero and each launch leaves them at zero. Grown,
    never shrunk or freed: a captured graph keeps using the buffers it was recorded with."""

    def __init__(self, device, stream):
        self.device, self.stream = device, stream     # held, so their ids stay unique
        self.part = self.counters = None
        self.retired = []

    def take(self, floats: int, tiles: int) -> tuple:
        if self.part is None or self.part.size < floats:
            self.retired.append(self.part)
            self.part = pk.empty(max(floats, 1 << 20), np.float32)
        if self.counters is None or self.counters.size < tiles:
            self.retired.append(self.counters)
            self.counters = pk.zeros(max(tiles, 4096), np.int32)
        return self.part, self.counters

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.part, self.counters, *self.retired) if a is not None)


def split_workspace_bytes(device=None) -> int:
    """Device bytes held by the split launches' workspaces on `device` (every stream, the
    retired buffers that captured graphs may still use included): for memory reports."""
    device = device or pk.current_device()
    return sum(w.nbytes for w in _WORKSPACES.values() if w.device is device)


__all__ = ["gemm_q8k_into", "auto_split", "launch_split", "split_workspace_bytes", "Q8KTiles",
           "TUNED_KTILES", "KQUANT_GEMM_TYPES", "SUPERBLOCK_GEMM_TYPES", "stage_words"]
