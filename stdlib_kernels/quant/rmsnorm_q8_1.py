"""RMSNorm fused with the Q8_1 quantization of its output: the decode step's "normalize, then
quantize for the DP4A GEMV" in one launch.

    rmsnorm_q8_1_into(x, weight, eps, xq, out=None)   x float32 (rows, n), n % 32 == 0;
        weight float32 (n,) or None; xq uint8 (rows, n//32*36) receives Q8_1(x * rstd * weight);
        out (optional, float32 like x) also receives the normalized values.
    rmsnorm_q8_1(x, weight, eps) -> (xq, out)          allocating wrapper (numpy or device x)

One 1024-thread block per row; warp w loads Q8_1 blocks w, w + 32, ... of the row into
registers (CHUNKS = n / 1024 rounded up of them: one value per thread each), the block sums squares (f32, warp shuffles + shared memory) into
rstd = 1 / sqrt(mean + eps) (correctly rounded sqrt, like stdlib_kernels.norm), and each warp
normalizes and quantizes its blocks exactly as q8_1.quantize_q8_1 does. The sum order differs from norm.rmsnorm's, so values agree with it to
f32 rounding (not bit for bit); Q8_1 bytes of a value on a rounding boundary can differ by one.
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32

from .q8_1 import Q8_1_BLOCK_BYTES, q8_1_bytes, store_q8_1_block

THREADS = 1024


@pk.func
def warp_sum(v: f32) -> f32:
    for step in pk.static_range(5):
        v = v + pk.shfl_xor(v, 16 >> step)
    return v


@pk.kernel
def rmsnorm_q8_1_kernel(x: Ptr[f32, "ro"], weight: Ptr[f32, "ro"], xq: Ptr[u32], out: Ptr[f32],
                        n: i32, eps: f32, HAS_W: Const[bool], HAS_OUT: Const[bool],
                        CHUNKS: Const[int]):
    # warp wp holds Q8_1 blocks wp, wp + 32, ... (lane l = value l): the row is read once,
    # kept in registers, and each block is quantized by the warp that loaded it
    pk.launch_dependents()   # decode: one block, let the next kernel launch now
    scratch = pk.shared_array(f32, THREADS // 32)
    tid = pk.thread_idx.x
    lane = tid % 32
    wp = tid // 32
    row = pk.block_idx.x
    nblocks = n // 32
    vals = pk.local_array(f32, CHUNKS)
    ss = f32(0.0)
    for ch in pk.static_range(CHUNKS):
        blk = wp + ch * (THREADS // 32)
        vals[ch] = 0.0
        if blk < nblocks:
            vals[ch] = x[row * n + blk * 32 + lane]
        ss += vals[ch] * vals[ch]
    ss = warp_sum(ss)
    if lane == 0:
        scratch[wp] = ss
    pk.syncthreads()
    total = warp_sum(scratch[lane])
    scale = 1.0 / pk.sqrt(total / f32(n) + eps)
    for ch in pk.static_range(CHUNKS):
        blk = wp + ch * (THREADS // 32)
        if blk < nblocks:
            c = blk * 32 + lane
            v = vals[ch] * scale
            if HAS_W:
                v = v * weight[c]
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
    rmsnorm_q8_1_kernel[rows, THREADS, stream](
        flat, flat if weight is None else weight, words, flat if out is None else out.reshape(-1),
        n, float(eps), weight is not None, out is not None, -(-n // THREADS))


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
