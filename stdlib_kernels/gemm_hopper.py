"""A warp-specialised Hopper GEMM: C (M x N, f32 or bf16) = A (M x K) . B^T (B: N x K), A and B
bf16 or f16, row-major, accumulated in f32 by wgmma (sm_90a; the CPU target emulates it).

A persistent grid (one block per multiprocessor) walks the BM x BN tiles of C (BM = 128;
BN = 128 or 256, tile t at row (t / tiles_n) BM, column (t % tiles_n) BN), 384 threads a block:

    warpgroup 0 (producer, setmaxnreg_dec to 40 registers): thread 0 loads K slices of 64
        (A: 128 x 64, B: BN x 64, 128-byte rows) by TMA into STAGES ring slots of 128-byte-
        swizzled shared memory; slot s lands on full[s], and is refilled once every consumer
        thread arrived on empty[s]
    warpgroups 1, 2 (consumers, setmaxnreg_inc to 232): rows 64 c .. 64 c + 63 of the tile each;
        per slot 4 x wgmma m64nBNk16 through swizzle-128 descriptors, one commit group; wait
        until at most one group is in flight, then release the previous slot

    shared (dynamic): [pad to 1024 B] slot 0: A 128x64 | B BNx64, slot 1 ..., each slot
    (128 + BN) * 128 bytes, a multiple of 1024 (the swizzle's repeat)

The ring runs on across tiles (the producer loads the next tile's slices while the consumers
store this one). The epilogue stores the accumulators straight to C (row / col checked
against M, N). TMA clips the tiles at M, N and K (zeros past the edges), so M and N are free; K must be a
multiple of 8 (TMA's 16-byte row pitch). Accumulation order: per output element, the products
a[k] * b[k] (exact in f32) added to an f32 sum for k = 0, 1, ..., K - 1, which is what the CPU
target's emulation computes (the GPU's tensor cores add in another order)."""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, i32, u16, u64
from stdlib_kernels._launch import multiprocessors

BM, BK = 128, 64
THREADS = 384                       # producer warpgroup + 2 consumer warpgroups
CONSUMERS = 256
SWIZZLE_ALIGN = 1024                # 128-byte swizzle repeats every 8 rows of 128 B
PRODUCER_REGS, CONSUMER_REGS = 40, 232   # 128 x (40 + 2 x 232) <= 64 Ki registers


# launch bounds: 384 threads start with at most 65536 / 384 = 168 registers each, which
# setmaxnreg then moves from the producer to the consumers
@pk.kernel(max_threads=THREADS, min_blocks=1)
def gemm_tn(ta: pk.TensorMap, tb: pk.TensorMap, c: Ptr["C"], M: i32, N: i32, K: i32,
            C: Const[pk.dtype], KIND: Const[str], BN: Const[int], STAGES: Const[int]):
    bars = pk.shared_array(u64, 2 * STAGES)      # full[s] = bars[s], empty[s] = bars[S + s]
    smem = pk.dynamic_shared(u16)
    # the tiles start at the first 1024-byte-aligned shared address (the swizzle's repeat):
    # a descriptor's start field is that address >> 4
    addr = i32(pk.wgmma_desc(smem, 0, 16, 1024, 0) & u64(0x3FFF)) * 16
    base = ((SWIZZLE_ALIGN - addr % SWIZZLE_ALIGN) % SWIZZLE_ALIGN) // 2
    slot = (BM + BN) * BK                        # elements per ring slot
    t = pk.thread_idx.x
    if t == 0:
        for s in pk.static_range(STAGES):
            pk.mbarrier_init(bars, s, 1)                 # the producer's expect-tx arrival
            pk.mbarrier_init(bars, STAGES + s, CONSUMERS)
        pk.fence_mbarrier_init()
    pk.syncthreads()
    k_tiles = (K + BK - 1) // BK
    tiles_n = (N + BN - 1) // BN
    tiles = ((M + BM - 1) // BM) * tiles_n
    it = 0                          # K slices through the ring so far: slot it % S, its phase
    if t < 128:
        pk.setmaxnreg_dec(PRODUCER_REGS)
        if t == 0:
            for tile in range(pk.block_idx.x, tiles, pk.grid_dim.x):
                m0, n0 = (tile // tiles_n) * BM, (tile % tiles_n) * BN
                for kt in range(k_tiles):
                    s = it % STAGES
                    if it >= STAGES:                     # the consumers freed slot s
                        pk.mbarrier_wait(bars, STAGES + s, (it // STAGES - 1) % 2)
                    pk.mbarrier_arrive_expect_tx(bars, s, slot * 2)
                    pk.tma_load(smem, base + s * slot, ta, (m0, kt * BK), bars, s)
                    pk.tma_load(smem, base + s * slot + BM * BK, tb, (n0, kt * BK), bars, s)
                    it += 1
    else:
        pk.setmaxnreg_inc(CONSUMER_REGS)
        acc = pk.local_array(pk.f32, BN // 2)
        half = t // 128 - 1                              # rows 64 half .. 64 half + 63
        w, g, q = (t % 128) // 32, (t % 32) // 4, t % 4       # the wgmma accumulator layout
        for tile in range(pk.block_idx.x, tiles, pk.grid_dim.x):
            for i in pk.static_range(BN // 2):
                acc[i] = 0.0
            for kt in range(k_tiles):
                s = it % STAGES
                pk.mbarrier_wait(bars, s, (it // STAGES) % 2)
                da = pk.wgmma_desc(smem, base + s * slot + half * 64 * BK, 16, 1024, 128)
                db = pk.wgmma_desc(smem, base + s * slot + BM * BK, 16, 1024, 128)
                pk.wgmma_fence()
                for k in pk.static_range(BK // 16):      # k16 steps: + 32 bytes, 2 in the
                    step = u64(2 * k)                    # descriptor's address field
                    pk.wgmma(acc, da + step, db + step, KIND, 1)
                pk.wgmma_commit_group()
                pk.wgmma_wait_group(1, acc)              # slice it - 1's wgmmas are done
                if kt > 0:
                    pk.mbarrier_arrive(bars, STAGES + (it - 1) % STAGES)
                it += 1
            pk.wgmma_wait_group(0, acc)
            pk.mbarrier_arrive(bars, STAGES + (it - 1) % STAGES)   # the tile's last slice
            # the epilogue overlaps the producer's loads of the next tile's first slices
            row = (tile // tiles_n) * BM + 64 * half + 16 * w + g
            col0 = (tile % tiles_n) * BN + 2 * q
            for h in pk.static_range(2):                 # rows row, row + 8
                if row + 8 * h < M:
                    out = c + (pk.i64(row + 8 * h) * pk.i64(N) + pk.i64(col0))
                    for i in pk.static_range(h * 2, BN // 2, 4):
                        for j in pk.static_range(2):
                            if col0 + 8 * (i // 4) + j < N:
                                out[8 * (i // 4) + j] = C(acc[i + j])


# (BN, STAGES): 128 x 256 tiles, 4 slots of 48 KiB for large problems; 128 x 128, 4 slots of
# 32 KiB where a 256-wide tile would leave SMs idle or mostly clip
CONFIGS = {"large": (256, 4), "small": (128, 4)}
INPUTS = {"bf16": "bf16", "f16": "f16"}


def choose_config(M: int, N: int, sms: int = 132) -> tuple[int, int]:
    """(BN, STAGES): the wide tile when it still gives every one of `sms` multiprocessors a
    tile; else the narrow one."""
    wide_tiles = -(-M // BM) * -(-N // 256)
    return CONFIGS["large"] if N > 128 and wide_tiles >= sms else CONFIGS["small"]


def shared_bytes(bn: int, stages: int) -> int:
    return stages * (BM + bn) * BK * 2 + SWIZZLE_ALIGN     # + the alignment pad


def _input_kind(x, name: str) -> str:
    dtype = np.dtype(x.dtype)
    if dtype == np.float16:
        return "f16"
    if dtype == np.uint16:                       # bf16 arrays are uint16 bit patterns
        return "bf16"
    raise TypeError(f"gemm_hopper: {name} must be an f16 or bf16 (uint16 bits) array, got "
                    f"{dtype}")


def gemm_hopper(a, b, out=None, out_dtype=pk.f32, config=None, max_blocks=None, stream=None):
    """C = A . B^T: a (M, K) and b (N, K) device arrays, both f16 or both bf16 (uint16 bit
    arrays), row-major; out (M, N) f32 or bf16 (uint16 bits), allocated when None. K must be
    a multiple of 8. config = (BN, STAGES) overrides choose_config; the grid is persistent,
    min(tiles, max_blocks or the multiprocessor count) blocks walking the output tiles.
    Returns out."""
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
    sms = multiprocessors()
    bn, stages = config or choose_config(M, N, sms)
    ta = pk.tensor_map(a, (BM, BK), swizzle=128)
    tb = pk.tensor_map(b, (bn, BK), swizzle=128)
    tiles = -(-N // bn) * -(-M // BM)
    grid = min(tiles, max_blocks or sms)
    gemm_tn[grid, THREADS, stream, shared_bytes(bn, stages)](
        ta, tb, out, M, N, K, out_dtype, kind, bn, stages)
    return out
