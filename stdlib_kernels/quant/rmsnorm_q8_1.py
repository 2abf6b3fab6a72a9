"""RMSNorm fused with the Q8_1 quantization of its output: the decode step's "normalize, then
quantize for the DP4A GEMV" in one launch.

    rmsnorm_q8_1_into(x, weight, eps, xq, out=None)   x float32 (rows, n), n % 32 == 0;
        weight float32 (n,) or None; xq uint8 (rows, n//32*36) receives Q8_1(x * rstd * weight);
        out (optional, float32 like x) also receives the normalized values.
    rmsnorm_q8_1(x, weight, eps) -> (xq, out)          allocating wrapper (numpy or device x)

Blocks of WARPS warps. With few rows (decode: rows <= SPREAD_ROWS) each row is spread over
ceil(n / 32 / WARPS) blocks, each warp quantizing one Q8_1 block; with more rows (prefill)
one block per row, each warp quantizing every WARPS-th Q8_1 block. Every block of a row loads
the whole row (16-byte loads when the rows are 16-byte aligned) and sums its squares (f32,
warp shuffles + shared memory, the same order in each block) into rstd = 1 / sqrt(mean +
eps) (correctly rounded sqrt, like stdlib_kernels.norm); each warp then normalizes and
quantizes its blocks exactly as q8_1.quantize_q8_1 does. The sum order differs from
norm.rmsnorm's, so values agree with it to f32 rounding (not bit for bit); Q8_1 bytes of a
value on a rounding boundary can differ by one.

Why spread: in the decode graph this kernel sits between two GEMVs, so its latency is on the
token's critical path (65 launches per llama-8B token). One 1024-thread block per row, loading
its norm weights after the PDL wait, added 3.4 us a launch; the spread blocks, with the
weights (constant) loaded before the wait, ~0.4 us (benchmarks/RESULTS.md, "The decode norm
spread over blocks").
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32

from .._device import warp_sum
from .q8_1 import Q8_1_BLOCK_BYTES, q8_1_bytes, store_q8_1_block

# warps per block; rows up to SPREAD_ROWS (decode, batched decode): a row over several blocks,
# each warp quantizing SPREAD_PER_WARP Q8_1 blocks; more rows: one block per row. H200, 8B
# decode: 16 or 32 warps with one Q8_1 block each fastest (8 warps -0.2%, 2 per warp -1.2%).
# 16 rows (H100, the 8B's batched step of 16 sequences): one block per row took 5.7 us a
# launch, 65 a step (benchmarks/RESULTS.md "Batched decode: attention splits for the whole
# batch, ...")
WARPS = 16
SPREAD_ROWS = 16
SPREAD_PER_WARP = 1


@pk.kernel
def rmsnorm_q8_1_kernel(x: Ptr[f32], weight: Ptr[f32, "ro"], xq: Ptr[u32], out: Ptr[f32],
                        n: i32, eps: f32, HAS_W: Const[bool], HAS_OUT: Const[bool],
                        CHUNKS: Const[int], PER_WARP: Const[int], WARPS: Const[int],
                        VEC: Const[int]):
    # grid (rows, G): every block of a row sums the squares of the whole row (the same loads
    # and order in each, so the same rstd), then warp w of block g quantizes Q8_1 blocks
    # g * WARPS + w + k * WARPS * G, k < PER_WARP. The norm weights, constant, load before
    # the PDL wait; x, the previous kernel's output, after it (coherent loads, which ptxas
    # keeps below the wait)
    pk.launch_dependents()   # decode: few blocks, let the next kernel launch now
    scratch = pk.shared_array(f32, WARPS)
    tid = pk.thread_idx.x
    lane = tid % 32
    wp = tid // 32
    row = pk.block_idx.x
    spread = pk.grid_dim.y
    nblocks = n // 32
    first = pk.block_idx.y * WARPS + wp      # this warp's Q8_1 blocks: first + k WARPS G
    wv = pk.local_array(f32, PER_WARP)
    for k in pk.static_range(PER_WARP):
        blk = first + k * WARPS * spread
        wv[k] = 1.0
        if HAS_W and blk < nblocks:
            wv[k] = weight[blk * 32 + lane]
    pk.grid_dependency_wait()
    ss = f32(0.0)
    for ch in pk.static_range(CHUNKS):
        c = (ch * (32 * WARPS) + tid) * VEC
        if c < n:
            if VEC == 4:
                a, b, d, e = pk.load_vec(x, row * n + c, 4)
                ss += a * a + b * b + d * d + e * e
            else:
                v = x[row * n + c]
                ss += v * v
    ss = warp_sum(ss)
    if lane == 0:
        scratch[wp] = ss
    pk.syncthreads()
    total = f32(0.0)
    if lane < WARPS:
        total = scratch[lane]
    total = warp_sum(total)
    scale = 1.0 / pk.sqrt(total / f32(n) + eps)
    for k in pk.static_range(PER_WARP):
        blk = first + k * WARPS * spread
        if blk < nblocks:
            c = blk * 32 + lane
            v = x[row * n + c] * scale
            if HAS_W:
                v = v * wv[k]
            if HAS_OUT:
                out[row * n + c] = v
            store_q8_1_block(v, lane, xq, row * nblocks + blk)


def rmsnorm_q8_1_into(x, weight, eps: float, xq, out=None, stream=None) -> None:
    """Normalize float32 device rows x (rows, n) and write their Q8_1 bytes to xq (and the f32
    values to out when given). No allocation, no synchronisation (graph-capturable)."""
    if x.dtype != np.float32:
        raise ValueError(f"rmsnorm_q8_1: x must be float32, got {x.dtype}")
    n = x.shape[-1]
    rows = x.size // n
    if n % 32:
        raise ValueError(f"rmsnorm_q8_1: row length {n} is not a multiple of 32 (Q8_1 block)")
    if xq.nbytes != rows * (n // 32) * Q8_1_BLOCK_BYTES:
        raise ValueError(f"rmsnorm_q8_1: xq has {xq.nbytes} bytes, {rows} rows of {n} values "
                         f"need {rows * q8_1_bytes(n)}")
    if weight is not None and (weight.dtype != np.float32 or weight.size != n):
        raise ValueError(f"rmsnorm_q8_1: weight must be float32 ({n},), got {weight.dtype} "
                         f"{tuple(weight.shape)}")
    if out is not None and (out.dtype != np.float32 or out.size != x.size):
        raise ValueError(f"rmsnorm_q8_1: out must be float32 like x {tuple(x.shape)}")
    words = xq.reshape(-1).view(np.uint32) if xq.dtype != np.uint32 else xq.reshape(-1)
    flat = x.reshape(-1)
    nblocks = n // 32
    vec = 4 if flat.ptr % 16 == 0 else 1     # rows of n % 32 == 0 floats: 16-byte aligned
    spread = -(-nblocks // (WARPS * SPREAD_PER_WARP)) if rows <= SPREAD_ROWS else 1
    rmsnorm_q8_1_kernel[(rows, spread), 32 * WARPS, stream](
        flat, flat if weight is None else weight, words, flat if out is None else out.reshape(-1),
        n, float(eps), weight is not None, out is not None, -(-n // (32 * WARPS * vec)),
        -(-nblocks // (WARPS * spread)), WARPS, vec)


def rmsnorm_q8_1(x, weight=None, eps: float = 1e-6):
    """(Q8_1 bytes (rows, n//32*36), normalized float32 rows) of x (rows, n)."""
    if isinstance(x, np.ndarray):
        x = pk.to_device(np.ascontiguousarray(x, dtype=np.float32))
    if isinstance(weight, np.ndarray):
        weight = pk.to_device(np.ascontiguousarray(weight, dtype=np.float32))
    rows = x.size // x.shape[-1]
    xq = pk.empty((rows, q8_1_bytes(x.shape[-1])), np.uint8)
    out = pk.empty(x.shape, np.float32)
    rmsnorm_q8_1_into(x, weight, eps, xq, out)
    return xq, out
