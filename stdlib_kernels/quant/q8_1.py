"""Activations to Q8_1 on the device: the input of the DP4A GEMV and the int8 GEMM.

    quantize_q8_1(x) -> uint8 (rows, n//32*36)       x: float32 (n,) or (rows, n), n % 32 == 0
    quantize_q8_1_into(x, out)                      preallocated out, no host sync, no allocation

Q8_1 block (36 B = 9 u32 words): word 0 = d:f16 | s:f16 << 16, words 1..8 = qs: i8[32].
Bit-exact with `reference.quantize_q8_1` (llama.cpp's CUDA convention): d = amax/127,
q = roundf(x/d) (0 when amax == 0), s = sum(x) as a warp butterfly (halves 16, 8, 4, 2, 1).
One warp quantizes U consecutive blocks (its U loads issued first): lane l holds value l of each.
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32

Q8_1_BLOCK_BYTES = 36
Q8_1_WORDS = 9
_WARPS = 8
# inputs of more than MANY_BLOCKS blocks: BLOCKS_PER_WARP blocks per warp (benchmarks/RESULTS.md,
# "Q8_1 quantize")
MANY_BLOCKS = 16384
BLOCKS_PER_WARP = 4


@pk.func
def round_half_away(v: f32) -> f32:
    """C roundf on |v|: floor, then step up when the dropped part is at least one half (exact:
    |v| - floor(|v|) is representable), then the sign back."""
    a = abs(v)
    t = pk.floor(a)
    if a - t >= 0.5:
        t = t + 1.0
    return -t if v < 0.0 else t


@pk.func
def store_q8_1_block(v: f32, lane: i32, out: Ptr[u32], block: i32):
    """Warp-collective: lane l holds value l of Q8_1 block `block`; writes its 9 words."""
    amax = abs(v)
    total = v
    for step in pk.static_range(5):
        amax = max(amax, pk.shfl_xor(amax, 16 >> step))
        total = total + pk.shfl_xor(total, 16 >> step)
    d = amax / 127.0
    q = i32(0)
    if amax != 0.0:
        q = i32(round_half_away(v / d))
    # gather four neighbouring int8 into one word: lane 4i writes word 1 + i
    byte = u32(q) & u32(0xFF)
    b1 = pk.shfl_down(byte, 1)
    b2 = pk.shfl_down(byte, 2)
    b3 = pk.shfl_down(byte, 3)
    word = byte | (b1 << u32(8)) | (b2 << u32(16)) | (b3 << u32(24))
    base = block * 9
    if lane % 4 == 0:
        out[base + 1 + lane // 4] = word
    if lane == 0:
        out[base] = pk.pack_f16x2(d, total)


@pk.kernel
def q8_1_quantize_kernel(x: Ptr[f32, "ro"], out: Ptr[u32], nblocks: i32, WARPS: Const[int],
                         U: Const[int]):
    # warp w quantizes blocks U w .. U w + U - 1: all U loads first (a block's own chain of
    # shuffles is short; one load in flight per warp left large inputs latency-bound)
    pk.launch_dependents()   # decode: one short wave, let the next kernel launch now
    first = (pk.block_idx.x * WARPS + pk.thread_idx.x // 32) * U
    lane = pk.lane_id()
    vals = pk.local_array(f32, U)
    for u in pk.static_range(U):
        vals[u] = x[min(first + u, nblocks - 1) * 32 + lane]
    for u in pk.static_range(U):
        if first + u < nblocks:
            store_q8_1_block(vals[u], lane, out, first + u)


def q8_1_bytes(n: int) -> int:
    """Bytes of one Q8_1 row of n values."""
    return n // 32 * Q8_1_BLOCK_BYTES


def _check_activations(x, what: str) -> int:
    if x.dtype != np.float32:
        raise ValueError(f"{what}: activations must be float32, got {x.dtype}")
    n = x.shape[-1]
    if n % 32:
        raise ValueError(f"{what}: activation length {n} is not a multiple of 32 (Q8_1 block)")
    return n


def quantize_q8_1_into(x, out, stream=None, blocks_per_warp: int | None = None) -> None:
    """Quantize float32 device rows x (..., n) into out: uint8 (..., n//32*36) (or u32 words).

    No allocation, no synchronisation: safe inside a captured CUDA graph. blocks_per_warp:
    Q8_1 blocks per warp (None: 1 for inputs of up to MANY_BLOCKS blocks, a decode step's
    activations, where one short wave is fastest; BLOCKS_PER_WARP above, e.g. a prefill).
    """
    n = _check_activations(x, "quantize_q8_1")
    nblocks = x.size // 32
    if out.nbytes != nblocks * Q8_1_BLOCK_BYTES:
        raise ValueError(f"quantize_q8_1: output has {out.nbytes} bytes, {nblocks} Q8_1 blocks "
                         f"of {n // 32} per row need {nblocks * Q8_1_BLOCK_BYTES}")
    u = blocks_per_warp or (1 if nblocks <= MANY_BLOCKS else BLOCKS_PER_WARP)
    words = out.reshape(-1).view(np.uint32) if out.dtype != np.uint32 else out.reshape(-1)
    grid = (nblocks + _WARPS * u - 1) // (_WARPS * u)
    q8_1_quantize_kernel[grid, _WARPS * 32, stream](x.reshape(-1), words, nblocks, _WARPS, u)


def quantize_q8_1(x):
    """float32 (n,) or (rows, n) array (numpy or device) -> device uint8 Q8_1 rows."""
    return quantize_rows(x, q8_1_bytes, quantize_q8_1_into)


def quantize_rows(x, row_bytes, quantize_into):
    """float32 (n,) or (rows, n) array (numpy or device) -> a new device uint8 array of
    row_bytes(n) per row, filled by quantize_into(x, out) (same shape rank as x)."""
    if isinstance(x, np.ndarray):
        x = pk.to_device(np.ascontiguousarray(x, dtype=np.float32))
    rows = x.shape[0] if x.ndim == 2 else 1
    out = pk.empty((rows, row_bytes(x.shape[-1])), np.uint8)
    quantize_into(x, out)
    return out if x.ndim == 2 else out.reshape(-1)
