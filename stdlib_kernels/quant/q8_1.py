"""Activations to Q8_1 on the device: the input of the DP4A GEMV and the int8 GEMM.

    quantize_q8_1(x) -> uint8 (rows, n//32*36)       x: float32 (n,) or (rows, n), n % 32 == 0
    quantize_q8_1_into(x, out)                      preallocated out, no host sync, no allocation

Q8_1 block (36 B = 9 u32 words): word 0 = d:f16 | s:f16 << 16, words 1..8 = qs: i8[32].
Bit-exact with `reference.quantize_q8_1`: d = amax/127, q = roundf(x/d) (0 when amax == 0) as
llama.cpp's CUDA kernel, and s = d * sum(q) as ggml's CPU quantizer (not CUDA's sum(x)).
Why the quantized sum: a weight block with a min (Q4_1, Q5_1, Q4_K, Q5_K: w = d_w q_w + m,
q_w >= 0) dots as d_w d_x sum(q_w q_x) + m s. With s = d sum(q) that is exactly the dot of the
dequantized x, whose rounding errors the centred weights mostly cancel; with s = sum(x) the
d_w q_w term (mean ~7.5 d_w, not centred) keeps its share of the same errors uncancelled, and
the product's error doubles (SmolLM2 Q4_1's prompts: 4-5.6e-2 against the f32 oracle).
store_q8_1_block: one warp per block, lane l holds x[l] (the fused kernels' form); the quantize
kernel: 8 lanes per block, lane j holds x[4j .. 4j + 3] (store_q8_1_quarter: the same bits).
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
BLOCKS_PER_WARP = 8


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
    for step in pk.static_range(5):
        amax = max(amax, pk.shfl_xor(amax, 16 >> step))
    d = amax / 127.0
    q = i32(0)
    if amax != 0.0:
        q = i32(round_half_away(v / d))
    total = q           # integers: the sum is exact in any order
    for step in pk.static_range(5):
        total = total + pk.shfl_xor(total, 16 >> step)
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
        out[base] = pk.pack_f16x2(d, d * f32(total))


@pk.func
def store_q8_1_quarter(v0: f32, v1: f32, v2: f32, v3: f32, j: i32, out: Ptr[u32], block: i32,
                       valid: bool):
    """8-lane-collective (all 32 lanes call it, each 8-lane group for its own block): lane j of
    the group holds values 4j .. 4j + 3 of Q8_1 block `block` and, if valid, writes word 1 + j
    (lane 0 of the group: word 0). The same bits as store_q8_1_block."""
    amax = max(max(abs(v0), abs(v1)), max(abs(v2), abs(v3)))
    for step in pk.static_range(3):
        amax = max(amax, pk.shfl_xor(amax, 4 >> step))
    d = amax / 127.0
    q0 = i32(0)
    q1 = i32(0)
    q2 = i32(0)
    q3 = i32(0)
    if amax != 0.0:
        q0 = i32(round_half_away(v0 / d))
        q1 = i32(round_half_away(v1 / d))
        q2 = i32(round_half_away(v2 / d))
        q3 = i32(round_half_away(v3 / d))
    total = (q0 + q1) + (q2 + q3)
    for step in pk.static_range(3):
        total = total + pk.shfl_xor(total, 4 >> step)
    word = (u32(q0) & u32(0xFF)) | ((u32(q1) & u32(0xFF)) << u32(8)) | \
        ((u32(q2) & u32(0xFF)) << u32(16)) | ((u32(q3) & u32(0xFF)) << u32(24))
    if valid:
        out[block * 9 + 1 + j] = word
        if j == 0:
            out[block * 9] = pk.pack_f16x2(d, d * f32(total))


@pk.kernel
def q8_1_quantize_kernel(x: Ptr[f32, "ro"], out: Ptr[u32], nblocks: i32, WARPS: Const[int],
                         U: Const[int]):
    # a warp quantizes 4 blocks per round (8 lanes each, one 16-byte load per lane) for U
    # rounds, all loads first: one block per warp and one 4-byte load per lane left large
    # inputs latency-bound (benchmarks/RESULTS.md, "Q8_1 quantize")
    pk.launch_dependents()   # decode: one short wave, let the next kernel launch now
    lane = pk.lane_id()
    j = lane % 8
    first = (pk.block_idx.x * WARPS + pk.thread_idx.x // 32) * 4 * U + lane // 8
    vals = pk.local_array(f32, 4 * U)
    for u in pk.static_range(U):
        a, b, c, d = pk.load_vec(x, min(first + 4 * u, nblocks - 1) * 32 + 4 * j, 4)
        vals[4 * u] = a
        vals[4 * u + 1] = b
        vals[4 * u + 2] = c
        vals[4 * u + 3] = d
    for u in pk.static_range(U):
        blk = first + 4 * u        # groups past the end redo the last block, unstored
        store_q8_1_quarter(vals[4 * u], vals[4 * u + 1], vals[4 * u + 2], vals[4 * u + 3], j,
                           out, blk, blk < nblocks)


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

    No allocation, no synchronisation: safe inside a captured CUDA graph. blocks_per_warp (a
    multiple of 4): Q8_1 blocks per warp (None: 4 for inputs of up to MANY_BLOCKS blocks, a
    decode step's activations, where one short wave is fastest; BLOCKS_PER_WARP above).
    """
    n = _check_activations(x, "quantize_q8_1")
    nblocks = x.size // 32
    if out.nbytes != nblocks * Q8_1_BLOCK_BYTES:
        raise ValueError(f"quantize_q8_1: output has {out.nbytes} bytes, {nblocks} Q8_1 blocks "
                         f"of {n // 32} per row need {nblocks * Q8_1_BLOCK_BYTES}")
    if x.ptr % 16:
        raise ValueError("quantize_q8_1: activations must be 16-byte aligned")
    per_warp = blocks_per_warp or (4 if nblocks <= MANY_BLOCKS else BLOCKS_PER_WARP)
    if per_warp % 4:
        raise ValueError(f"quantize_q8_1: blocks_per_warp must be a multiple of 4, got "
                         f"{per_warp}")
    words = out.reshape(-1).view(np.uint32) if out.dtype != np.uint32 else out.reshape(-1)
    grid = (nblocks + _WARPS * per_warp - 1) // (_WARPS * per_warp)
    q8_1_quantize_kernel[grid, _WARPS * 32, stream](x.reshape(-1), words, nblocks, _WARPS,
                                                     per_warp // 4)


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
