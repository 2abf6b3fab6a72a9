"""A Hopper GEMM on GGUF weights: C (M x N, f32) = A (M x K, f16) . W^T, W (N x K) the raw
blocks of a quantized matrix, dequantized tile by tile to f16 in shared memory and multiplied
by wgmma with f32 accumulators (sm_90a; the CPU target emulates it). The host side (checks,
tensor maps, shared-memory budget, the launch); the kernel is gemm_hopper_quant_kernel.py, whose
consumer warpgroups are gemm_hopper's.

    gemm_hopper_quant(a, w_raw, "Q8_0") -> c     a f16 (M, K); w_raw uint8 (N, row_bytes)

Numerics: every weight is decode8's f32 value (the f16 prefill GEMM's, quant/gemm.py; equal to
quant.reference.dequantize) rounded to the nearest f16. For Q8_0 that is d x q (an f16 times an
int8: up to 8 + 11 significant bits) rounded once to 11 bits: a relative error of at most 2^-11
per weight (subnormal f16 results, |d q| < 2^-14, lose more: absolute 2^-25), the same weights
the f16 prefill path multiplies. On the CPU target the products are added in k order in f32,
so a numpy reference of the same steps is bit-exact; the GPU's tensor cores add in another
order (bound: K 2^-24 sum_k |a w|).

Served formats (SERVED): every format decode8 reads whose blocks divide 256 values: Q4_0,
Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. K must be a multiple of 256 (SLAB) and
W's rows whole 16 bytes (TMA's row pitch: K a multiple of 2048 for Q3_K and Q6_K, 1024 for
Q2_K); M and N are free (TMA clips A's and W's tiles). A slab whose bytes do not start at a
whole 16 bytes (Q6_K's 210-byte super-blocks) is read from the 16-byte floor in a wider box
(box_bytes).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

import pykernel as pk
from stdlib_kernels._launch import multiprocessors
from stdlib_kernels.gemm_hopper import SHARED_LIMIT, GemmConfig, shared_bytes
from stdlib_kernels.gemm_hopper_kernel import BK, BM, EPI_BOX_ROWS, THREADS
from stdlib_kernels.gemm_hopper_quant_kernel import RAW_STAGES, SLAB, gemm_q_tn
from stdlib_kernels.quant.formats import get_format
from stdlib_kernels.quant.gemv import word_dtype

__all__ = ["SERVED", "QuantConfig", "as_quant_config", "box_bytes", "choose_quant_config",
           "gemm_hopper_quant", "gemm_q_tn", "quant_shared_bytes"]

SERVED = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
class QuantConfig(NamedTuple):
    """gemm: gemm_hopper's options (tile width, ring slots, tile order, ping-pong, epilogue);
    raw_stages: raw slab slots (the dequantizers' copies run raw_stages - 1 slabs ahead); bm:
    tile rows, 128 (gemm_hopper's consumers) or 256 (both consumer warpgroups on one tile, 128
    rows each: half the dequantization per multiply-add, half the tiles; no ping-pong)."""
    gemm: GemmConfig
    raw_stages: int = RAW_STAGES
    bm: int = BM

    @classmethod
    def parse(cls, text: str) -> QuantConfig:
        """A gemm_hopper config string plus optional '/rawR' (raw slots) and '/m256' (tile
        rows): e.g. '128x3/raw3', '128x3/m256/tma2'."""
        parts = text.split("/")
        ours = [p for p in parts if p.startswith(("raw", "m"))]
        fields = {}
        try:
            for opt in ours:
                fields["raw_stages" if opt.startswith("raw") else "bm"] = int(
                    opt[3:] if opt.startswith("raw") else opt[1:])
        except ValueError:
            raise ValueError(f"gemm_hopper_quant: config {text!r}: '/rawR' takes a number of "
                             f"raw slots, '/mB' tile rows, e.g. 128x3/raw3/m256") from None
        return cls(GemmConfig.parse("/".join(p for p in parts if p not in ours)), **fields)

    def __str__(self) -> str:
        return (str(self.gemm) + (f"/raw{self.raw_stages}" if self.raw_stages != RAW_STAGES
                                  else "") + (f"/m{self.bm}" if self.bm != BM else ""))


# tried in order by choose_quant_config: the first that fits a block's shared memory
CANDIDATES = [QuantConfig(GemmConfig(128, 4, 16, False, 2)), QuantConfig(GemmConfig(128, 4, 16)),
              QuantConfig(GemmConfig(128, 3, 16, False, 2)), QuantConfig(GemmConfig(128, 3, 16)),
              QuantConfig(GemmConfig(128, 2, 16)), QuantConfig(GemmConfig(64, 2, 16))]


def slab_bytes(type_name: str) -> int:
    """Bytes of SLAB (256) values of a row of `type_name`."""
    fmt = get_format(type_name)
    return SLAB // fmt.block_elems * fmt.block_bytes


def box_bytes(type_name: str) -> int:
    """Bytes of a row's raw box: the slab (slab_bytes) from the 16-byte floor of its first
    byte, whose distance from it is at most 16 - gcd(slab_bytes, 16), in whole 16 bytes."""
    sb = slab_bytes(type_name)
    return -(-(sb + 16 - math.gcd(sb, 16)) // 16) * 16


def quant_shared_bytes(qc: QuantConfig, type_name: str) -> int:
    """The ring of (bm + bn) x 64 f16 slots, the epilogue buffers, the alignment pad and the
    raw slabs."""
    cfg = qc.gemm
    return (shared_bytes(cfg.bn, cfg.stages, cfg.epilogue) + cfg.stages * (qc.bm - BM) * BK * 2
            + qc.raw_stages * cfg.bn * box_bytes(type_name))


def _block_shared_bytes(qc: QuantConfig, type_name: str) -> int:
    static = 8 * (2 * qc.gemm.stages + 2 + 2 * qc.raw_stages)      # the mbarriers
    return quant_shared_bytes(qc, type_name) + static


def _fits(qc: QuantConfig, type_name: str) -> bool:
    return _block_shared_bytes(qc, type_name) <= SHARED_LIMIT


def choose_quant_config(type_name: str) -> QuantConfig:
    """The first of CANDIDATES whose ring, epilogue and raw slabs fit a block."""
    return next(qc for qc in CANDIDATES if _fits(qc, type_name))


def as_quant_config(config) -> QuantConfig:
    """A QuantConfig from itself, its string, a GemmConfig or a GemmConfig tuple."""
    if isinstance(config, QuantConfig):
        return config
    if isinstance(config, str):
        return QuantConfig.parse(config)
    return QuantConfig(GemmConfig(*config))


def _check_config(qc: QuantConfig, type_name: str, N: int) -> None:
    cfg = qc.gemm
    if cfg.bn % 64 or not 64 <= cfg.bn <= 256 or cfg.stages < 1 or cfg.group_m < 1 \
            or cfg.epilogue < 0 or qc.raw_stages < 1 or qc.bm not in (128, 256):
        raise ValueError(f"gemm_hopper_quant: config {qc}: bn must be 64, 128, 192 or 256, "
                         f"bm 128 or 256, stages, group_m and raw stages >= 1, epilogue >= 0")
    if cfg.pingpong and (cfg.bn > 128 or qc.bm != BM):
        raise ValueError(f"gemm_hopper_quant: config {qc}: pingpong needs bn <= 128 and bm "
                         f"128")
    if qc.bm > BM and cfg.bn > 128:
        raise ValueError(f"gemm_hopper_quant: config {qc}: 256-row tiles keep two bn / "
                         f"2-register accumulators per thread, so bn must be at most 128")
    if not _fits(qc, type_name):
        raise ValueError(f"gemm_hopper_quant: config {qc} with {type_name} needs "
                         f"{_block_shared_bytes(qc, type_name)} bytes of shared memory; a "
                         f"block has {SHARED_LIMIT}: fewer stages or raw slots, a narrower "
                         f"tile or no epilogue buffers")
    if cfg.epilogue and (N * 4) % 16:
        raise ValueError(f"gemm_hopper_quant: config {qc}: the TMA epilogue needs N x 4 "
                         f"bytes = {N * 4} a multiple of 16; use epilogue=0")


def _check_arrays(a, w_raw, type_name: str, out):
    """(M, N, K, out) after the argument checks; out allocated when None."""
    if type_name not in SERVED:
        raise ValueError(f"gemm_hopper_quant: {type_name} is not served; served: "
                         f"{', '.join(SERVED)}")
    if np.dtype(a.dtype) != np.float16 or a.ndim != 2:
        raise TypeError(f"gemm_hopper_quant: a must be an f16 (M, K) array, got {a.dtype} "
                        f"{tuple(a.shape)}")
    M, K = a.shape
    if M <= 0 or K <= 0 or K % SLAB:
        raise ValueError(f"gemm_hopper_quant: K = {K} must be a positive multiple of {SLAB} "
                         f"(M = {M} positive)")
    per_row = K // SLAB * slab_bytes(type_name)
    if np.dtype(w_raw.dtype) != np.uint8 or w_raw.ndim != 2 or w_raw.shape[1] != per_row \
            or w_raw.shape[0] <= 0:
        raise ValueError(f"gemm_hopper_quant: w_raw must be uint8 (N, {per_row}) ({type_name} "
                         f"rows of K = {K}), got {w_raw.dtype} {tuple(w_raw.shape)}")
    N = w_raw.shape[0]
    if per_row % 16:
        raise ValueError(f"gemm_hopper_quant: {type_name} rows of K = {K} take {per_row} bytes, "
                         f"not whole 16 bytes (TMA's row pitch): K must be a multiple of "
                         f"{SLAB * 16 // math.gcd(slab_bytes(type_name), 16)}")
    if out is None:
        out = pk.empty((M, N), np.float32)
    elif tuple(out.shape) != (M, N) or np.dtype(out.dtype) != np.float32:
        raise ValueError(f"gemm_hopper_quant: out must be a ({M}, {N}) float32 array, got "
                         f"{tuple(out.shape)} {out.dtype}")
    return M, N, K, out


def gemm_hopper_quant(a, w_raw, type_name: str, out=None, config=None, max_blocks=None,
                      stream=None):
    """C = A . dequantize(W)^T: a (M, K) f16 and w_raw (N, row_bytes) uint8 device arrays;
    out (M, N) f32, allocated when None. config: a QuantConfig, its string ('128x4/g16/tma2',
    '128x3/raw3/m256'), a GemmConfig or its tuple; None = choose_quant_config (without the TMA
    epilogue where C's rows are not whole 16 bytes). The grid is persistent: min(tiles,
    max_blocks or the multiprocessor count) blocks. Returns out."""
    M, N, K, out = _check_arrays(a, w_raw, type_name, out)
    qc = choose_quant_config(type_name) if config is None else as_quant_config(config)
    if qc.gemm.epilogue and (N * 4) % 16 and config is None:
        qc = qc._replace(gemm=qc.gemm._replace(epilogue=0))
    _check_config(qc, type_name, N)
    cfg = qc.gemm
    sb, boxb = slab_bytes(type_name), box_bytes(type_name)
    ta = pk.tensor_map(a, (qc.bm, BK), swizzle=128)
    tw = pk.tensor_map(w_raw.reshape(-1).view(np.uint32).reshape(N, K // SLAB * sb // 4),
                       (cfg.bn, boxb // 4))
    tc = pk.tensor_map(out, (EPI_BOX_ROWS, 32), swizzle=128) if cfg.epilogue else ta
    tiles = -(-N // cfg.bn) * -(-M // qc.bm)
    grid = min(tiles, max_blocks or multiprocessors())
    fmt = get_format(type_name)
    gemm_q_tn[grid, THREADS, stream, quant_shared_bytes(qc, type_name)](
        ta, tw, tc, out, M, N, K, fmt.id, np.dtype(word_dtype(type_name)), sb, boxb,
        qc.raw_stages, cfg.bn, cfg.stages, cfg.group_m, int(cfg.pingpong), cfg.epilogue, qc.bm)
    return out
