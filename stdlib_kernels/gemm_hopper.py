"""A warp-specialised Hopper GEMM: C (M x N, f32 or bf16) = A (M x K) . B^T (B: N x K), A and B
bf16 or f16, row-major, accumulated in f32 by wgmma (sm_90a; the CPU target emulates it).
This module is the host side (configs, checks, tensor maps, the launch); the kernel and its
options are in gemm_hopper_kernel.py.

A persistent grid (one block per multiprocessor) walks the 128 x BN tiles of C, 384 threads a
block: warpgroup 0 produces (thread 0 TMA-loads K slices of 64 into STAGES ring slots guarded by
full / empty mbarriers), warpgroups 1 and 2 consume (wgmma through 128-byte-swizzle
descriptors; setmaxnreg moves registers from the producer to them). The ring runs on across
tiles (the producer loads the next tile's slices while the consumers store this one). TMA clips
the tiles at M, N and K (zeros past the edges), so M and N are free; K must be a multiple of 8
(TMA's 16-byte row pitch), and with the TMA epilogue N * sizeof(C) a multiple of 16 too.

GemmConfig(bn, stages, group_m, pingpong, epilogue) picks the kernel's options (see
gemm_hopper_kernel.py): tile width, ring depth, grouped tile order, ping-pong consumers, and the
epilogue (0: direct 8-byte stores; E: TMA stores through E staging buffers per consumer warp).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

import pykernel as pk
from stdlib_kernels._launch import multiprocessors
from stdlib_kernels.gemm_hopper_kernel import (
    BK,
    BM,
    EPI_BOX_BYTES,
    EPI_BOX_ROWS,
    SWIZZLE_ALIGN,
    THREADS,
    gemm_tn,
)

__all__ = ["CONFIGS", "GemmConfig", "choose_config", "gemm_hopper", "gemm_tn", "shared_bytes"]

SHARED_LIMIT = 227 * 1024           # dynamic + static shared memory of one block (H100 / H200)
CONSUMER_WARPS = 8


class GemmConfig(NamedTuple):
    """bn: tile width (64..256, a multiple of 64); stages: ring slots; group_m: tile rows per
    super-row of the tile order (1: row-major); pingpong: each consumer warpgroup owns whole
    128-row tiles (bn <= 128: two accumulators of bn / 2 registers); epilogue: 0 = direct
    stores, E = TMA stores through E 2 KiB buffers per consumer warp."""
    bn: int
    stages: int
    group_m: int = 1
    pingpong: bool = False
    epilogue: int = 0

    @classmethod
    def parse(cls, text: str) -> GemmConfig:
        """'256x4' (bn x stages) then optional '/gG' (group_m), '/pp' (pingpong), '/tmaE'
        (TMA epilogue, E buffers): e.g. '256x4/g16/tma2', '128x4/pp/tma2'."""
        first, *opts = text.split("/")
        try:
            bn, stages = (int(x) for x in first.split("x"))
            fields = {}
            for opt in opts:
                if opt == "pp":
                    fields["pingpong"] = True
                elif opt.startswith("g"):
                    fields["group_m"] = int(opt[1:])
                elif opt.startswith("tma"):
                    fields["epilogue"] = int(opt[3:])
                else:
                    raise ValueError(opt)
        except ValueError:
            raise ValueError(f"gemm_hopper: config {text!r} is not BNxSTAGES[/gG][/pp][/tmaE], "
                             f"e.g. 256x4/g16/tma2") from None
        return cls(bn, stages, **fields)

    def __str__(self) -> str:
        return (f"{self.bn}x{self.stages}" + (f"/g{self.group_m}" if self.group_m > 1 else "")
                + ("/pp" if self.pingpong else "")
                + (f"/tma{self.epilogue}" if self.epilogue else ""))


# Measured on the H200 (benchmarks/RESULTS.md, "The Hopper GEMM's options"): 4096^3 bf16 ->
# f32 at 735 TFLOPS (94% of cuBLAS) with 128 x 256 tiles in super-rows of 16 and the TMA
# epilogue (row-major, direct stores: 614); the narrow tile (as before: its options are not
# measured at small sizes yet) where a 256-wide one would leave SMs idle. The TMA epilogue needs C's row pitch to be a multiple of 16 bytes: otherwise the
# same tiles store directly.
CONFIGS = {"large": GemmConfig(256, 4, group_m=16, epilogue=2),
           "small": GemmConfig(128, 4)}


def choose_config(M: int, N: int, sms: int = 132, out_bytes: int = 4) -> GemmConfig:
    """The wide tile when it still gives every one of `sms` multiprocessors a tile; else the
    narrow one; the direct epilogue where C's rows (N x out_bytes) are not whole 16 bytes."""
    wide_tiles = -(-M // BM) * -(-N // 256)
    cfg = CONFIGS["large"] if N > 128 and wide_tiles >= sms else CONFIGS["small"]
    return cfg if (N * out_bytes) % 16 == 0 else cfg._replace(epilogue=0)


def shared_bytes(bn: int, stages: int, epilogue: int = 0) -> int:
    """Dynamic shared memory of a launch: the ring, the consumer warps' epilogue buffers and
    the 1024-byte alignment pad."""
    return (stages * (BM + bn) * BK * 2 + CONSUMER_WARPS * epilogue * EPI_BOX_BYTES
            + SWIZZLE_ALIGN)


def _input_kind(x, name: str) -> str:
    dtype = np.dtype(x.dtype)
    if dtype == np.float16:
        return "f16"
    if dtype == np.uint16:                       # bf16 arrays are uint16 bit patterns
        return "bf16"
    raise TypeError(f"gemm_hopper: {name} must be an f16 or bf16 (uint16 bits) array, got "
                    f"{dtype}")


def _check_config(cfg: GemmConfig, N: int, out_dtype) -> None:
    if cfg.bn % 64 or not 64 <= cfg.bn <= 256 or cfg.stages < 1 or cfg.group_m < 1 \
            or cfg.epilogue < 0:
        raise ValueError(f"gemm_hopper: config {cfg!r}: bn must be 64, 128, 192 or 256, "
                         f"stages and group_m >= 1, epilogue >= 0")
    if cfg.pingpong and cfg.bn > 128:
        raise ValueError(f"gemm_hopper: config {cfg}: pingpong keeps two bn / 2-register "
                         f"accumulators per thread, so bn must be at most 128, got {cfg.bn}")
    need = shared_bytes(cfg.bn, cfg.stages, cfg.epilogue)
    if need > SHARED_LIMIT - 16 * cfg.stages:        # - the static mbarriers
        raise ValueError(f"gemm_hopper: config {cfg} needs {need} bytes of shared memory; a "
                         f"block has {SHARED_LIMIT}: fewer stages or epilogue buffers")
    size = 4 if out_dtype is pk.f32 else 2
    if cfg.epilogue and (N * size) % 16:
        raise ValueError(f"gemm_hopper: config {cfg}: the TMA epilogue stores rows of C whose "
                         f"pitch N x {size} bytes = {N * size} must be a multiple of 16; use "
                         f"epilogue=0")


def _check_arrays(a, b, out, out_dtype):
    """(kind, M, N, K, out) after the argument checks; out allocated when None."""
    kind = _input_kind(a, "a")
    if _input_kind(b, "b") != kind:
        raise TypeError(f"gemm_hopper: a and b must have one element type, got {a.dtype} and "
                        f"{b.dtype}")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"gemm_hopper: a (M, K) and b (N, K) must share K, got shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    (M, K), N = a.shape, b.shape[0]
    if min(M, N, K) <= 0:
        raise ValueError(f"gemm_hopper: M, N and K must be positive, got {M}, {N}, {K}")
    if K % 8:
        raise ValueError(f"gemm_hopper: K = {K} must be a multiple of 8 (TMA reads rows whose "
                         f"pitch is a whole number of 16 bytes); pad A and B with zero columns")
    if out_dtype not in (pk.f32, pk.bf16):
        raise TypeError(f"gemm_hopper: out_dtype must be pk.f32 or pk.bf16, got {out_dtype}")
    storage = np.float32 if out_dtype is pk.f32 else np.uint16
    if out is None:
        out = pk.empty((M, N), storage)
    elif tuple(out.shape) != (M, N) or np.dtype(out.dtype) != storage:
        raise ValueError(f"gemm_hopper: out must be a ({M}, {N}) {np.dtype(storage)} array, "
                         f"got {tuple(out.shape)} {out.dtype}")
    return kind, M, N, K, out


def gemm_hopper(a, b, out=None, out_dtype=pk.f32, config=None, max_blocks=None, stream=None):
    """C = A . B^T: a (M, K) and b (N, K) device arrays, both f16 or both bf16 (uint16 bit
    arrays), row-major; out (M, N) f32 or bf16 (uint16 bits), allocated when None. K must be
    a multiple of 8. config: a GemmConfig, its string form ('256x4/g16/tma2') or a tuple
    (bn, stages[, group_m, pingpong, epilogue]); None = choose_config. The grid is persistent,
    min(tiles, max_blocks or the multiprocessor count) blocks walking the output tiles.
    Returns out."""
    kind, M, N, K, out = _check_arrays(a, b, out, out_dtype)
    sms = multiprocessors()
    if config is None:
        cfg = choose_config(M, N, sms, 4 if out_dtype is pk.f32 else 2)
    elif isinstance(config, str):
        cfg = GemmConfig.parse(config)
    else:
        cfg = GemmConfig(*config)
    _check_config(cfg, N, out_dtype)
    ta = pk.tensor_map(a, (BM, BK), swizzle=128)
    tb = pk.tensor_map(b, (cfg.bn, BK), swizzle=128)
    # C's map: boxes of one warp's 16 rows x 128 bytes (the epilogue's); unused without it
    tc = (pk.tensor_map(out, (EPI_BOX_ROWS, 128 // out.itemsize), swizzle=128)
          if cfg.epilogue else ta)
    tiles = -(-N // cfg.bn) * -(-M // BM)
    grid = min(tiles, max_blocks or sms)
    gemm_tn[grid, THREADS, stream, shared_bytes(cfg.bn, cfg.stages, cfg.epilogue)](
        ta, tb, tc, out, M, N, K, out_dtype, kind, cfg.bn, cfg.stages, cfg.group_m,
        int(cfg.pingpong), cfg.epilogue)
    return out
