"""The kernel of stdlib_kernels.gemm_hopper_quant (host side, configs and docs there):
C (M x N, f32) = A (M x K, f16) . W^T, W (N x K) GGUF blocks dequantized to f16 in shared
memory, accumulated in f32 by wgmma (sm_90a; the CPU target emulates it).

gemm_hopper_kernel.py's consumers run unchanged (`consume`: wgmma m64nBNk16 f16 on ring slots
of A 128 x 64 | B BN x 64, 128-byte swizzle, and its epilogues); only the producer warpgroup
differs. Its warp 0 lane 0 (the A loader: gemm_hopper_kernel's `produce` without B)
TMA-loads A's 128 x 64 slices into the ring; its warps 1..3 (the dequantizers, 96 threads) turn
W's raw bytes into the slots' B halves: their thread 0 TMA-loads BN rows x SLAB values a slab
(SB bytes a row: a box of BOXB bytes from the 16-byte floor of the slab's first byte, since TMA
boxes start at whole 16 bytes; the slab sits at the same offset in every row's box) into RAW
raw slots, and all 96 write each slab's SLICES slices of B as f16 (decode8's f32 value rounded
to nearest even, the f16 GEMM's numerics; gemm_hopper_quant_dequant.py) in the layout a
128-byte-swizzle TMA load would have left (16-byte chunk x of row r at chunk x ^ (r % 8)), then
arrive on the slot's full barrier beside the A loader's expect-tx arrival. Barriers (bars):

    full[s] = s (1 + 96 arrivals + A's bytes)  empty[s] = S + s (the consumers')
    order[h] = 2 S + h (ping-pong turns)         raw_full[r] = 2 S + 2 + r (1 + W's bytes)
    raw_empty[r] = 2 S + 2 + RAW + r (the 96 dequantizers, once a slab)

    shared (dynamic): [pad to 1024 B] ring (gemm_hopper's) | epilogue boxes | raw slots

A block's slabs are numbered q = 0, 1, ... over its tiles (slabs_per_tile = K / SLAB each);
slab q + RAW - 1 is loaded as the dequantizers begin slab q, into the slot slab q - 1 left, so
its bytes are in flight while slab q is dequantized; the A loader runs independently, up to
STAGES slices ahead of the consumers."""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, i32, u32, u64
from stdlib_kernels.gemm_hopper_kernel import (
    BK,
    BM,
    EPI_BOX_BYTES,
    SWIZZLE_ALIGN,
    THREADS,
    consume,
    mainloop,
    produce,
    store_rows,
    swizzle_base,
    tile_origin,
)
from stdlib_kernels.gemm_hopper_quant_dequant import dequant_chunk

SLAB = 256                          # K values per raw copy (Q8_0: 8 blocks = 272 B = 17 x 16)
SLICES = SLAB // BK                 # ring slices per slab
RAW_STAGES = 2                      # raw slots by default (the RAW Const)
DEQUANT_THREADS = 96                # producer warps 1..3
CONSUMER_WARPS = 8
# setmaxnreg moves registers within the block's own: THREADS x ENTRY_REGS (384 x 168 =
# 64512; ptxas gives a kernel that uses setmaxnreg all its launch bound allows), so one
# producer and two consumer warpgroups must fit P + 2 C <= 3 x 168. The dequantizers need more
# than gemm_hopper's 40 (ptxas spills them at 40, not at 88); the consumers get the rest, 208.
# (96 + 2 x 208 = 65536 hung the GPU: the second consumer warpgroup's .inc never returned.)
ENTRY_REGS = pk.entry_registers(THREADS, 1)
PRODUCER_REGS = 88
CONSUMER_REGS = (3 * ENTRY_REGS - PRODUCER_REGS) // 2 // 8 * 8


@pk.func
def slab_origin(q: i32, slabs: i32, tiles_m: i32, tiles_n: i32, BN: Const[int],
                GROUP_M: Const[int]):
    """(n0, k0) of the block's q-th slab: W's rows of tile block + (q / slabs) grid, K from
    (q % slabs) SLAB."""
    tile = pk.block_idx.x + (q // slabs) * pk.grid_dim.x
    _m0, n0 = tile_origin(tile, tiles_m, tiles_n, BN, GROUP_M)
    return n0, (q % slabs) * SLAB


@pk.func
def load_raw(smem, raw0: i32, bars, tw, q: i32, slabs: i32, tiles_m: i32, tiles_n: i32,
             BN: Const[int], STAGES: Const[int], GROUP_M: Const[int], SB: Const[int],
             BOXB: Const[int], RAW: Const[int]):
    """Slab q's BN rows of BOXB raw bytes from the 16-byte floor of its first byte into raw
    slot q % RAW once the dequantizers freed it (tw: W's bytes as u32 words, box BN x
    BOXB / 4)."""
    rf = 2 * STAGES + 2
    r = q % RAW
    if q >= RAW:
        pk.mbarrier_wait(bars, rf + RAW + r, (q // RAW - 1) % 2)
    n0, k0 = slab_origin(q, slabs, tiles_m, tiles_n, BN, GROUP_M)
    pk.mbarrier_arrive_expect_tx(bars, rf + r, BN * BOXB)
    pk.tma_load(smem, raw0 + r * (BN * BOXB // 2), tw, (n0, k0 // SLAB * SB // 16 * 4), bars,
                rf + r)


@pk.func
def my_tiles(tiles: i32):
    """How many of the `tiles` this block takes (block, block + grid, ...)."""
    mine = 0
    if pk.block_idx.x < tiles:
        mine = (tiles - pk.block_idx.x + pk.grid_dim.x - 1) // pk.grid_dim.x
    return mine


@pk.func
def dequant_slice(words, wbase: i32, out32, b32: i32, j: i32, p: i32, FMT: Const[int],
                  BN: Const[int], BOXB: Const[int], WB: Const[int]):
    """Slice j (values 64 j..) of the raw slab at word wbase (rows BOXB bytes apart, words of
    WB bytes) as f16 into B at u32 index b32: thread p takes 8-value chunks p, p + 96, ...
    (chunk x of row r: values 8 x.., stored at 16-byte chunk x ^ (r % 8) of B's row r)."""
    for i in pk.static_range((BN * 8 + DEQUANT_THREADS - 1) // DEQUANT_THREADS):
        u = p + i * DEQUANT_THREADS         # unrolled: one chunk's loads overlap another's math
        if u < BN * 8:
            r, x = u // 8, u % 8
            p0, p1, p2, p3 = dequant_chunk(words, wbase + r * (BOXB // WB), j * BK + 8 * x,
                                           FMT)
            pk.store_vec(out32, b32 + r * 32 + (x ^ (r % 8)) * 4, (p0, p1, p2, p3))


@pk.func
def dequantize(smem, base: i32, raw0: i32, bars, tiles_m: i32, tiles_n: i32, slabs: i32,
               FMT: Const[int], WT: Const[pk.dtype], BN: Const[int], STAGES: Const[int],
               GROUP_M: Const[int], SB: Const[int], BOXB: Const[int], RAW: Const[int],
               BMQ: Const[int], tw):
    """A dequantizer thread (p = 0..95): each slab's SLICES slices into the ring's B parts,
    in the A loader's order; raw slot r is released after the slab's last slice. Thread 0
    also loads the raw slabs, RAW - 1 ahead: slab q + RAW - 1 as slab q begins, into the slot
    slab q - 1 left (so its bytes are in flight while slab q is dequantized)."""
    words = pk.dynamic_shared(WT)
    out32 = pk.dynamic_shared(u32)
    WB = 4 if WT == pk.u32 else 2
    p = pk.thread_idx.x - 32
    slot = (BMQ + BN) * BK
    rf = 2 * STAGES + 2
    total = my_tiles(tiles_m * tiles_n) * slabs
    if p == 0:
        for q in range(min(RAW - 1, total)):
            load_raw(smem, raw0, bars, tw, q, slabs, tiles_m, tiles_n, BN, STAGES, GROUP_M,
                     SB, BOXB, RAW)
    it = 0
    for q in range(total):
        if p == 0 and q + RAW - 1 < total:
            load_raw(smem, raw0, bars, tw, q + RAW - 1, slabs, tiles_m, tiles_n, BN, STAGES,
                     GROUP_M, SB, BOXB, RAW)
        r = q % RAW
        pk.mbarrier_wait(bars, rf + r, (q // RAW) % 2)
        # the slab's first byte, SB x (its index in the tile) mod 16 into each row's box
        wbase = (2 * raw0 + r * BN * BOXB + (q % slabs) * SB % 16) // WB
        for j in pk.static_range(SLICES):
            s = it % STAGES
            if it >= STAGES:
                pk.mbarrier_wait(bars, STAGES + s, (it // STAGES - 1) % 2)
            dequant_slice(words, wbase, out32, (base + s * slot + BMQ * BK) // 2, j, p, FMT,
                          BN, BOXB, WB)
            pk.fence_proxy_async()                      # generic writes -> wgmma's reads
            pk.mbarrier_arrive(bars, s)
            it += 1
        pk.mbarrier_arrive(bars, rf + RAW + r)


@pk.kernel(max_threads=THREADS, min_blocks=1)
def gemm_q_tn(ta: pk.TensorMap, tw: pk.TensorMap, tc: pk.TensorMap, c: Ptr[pk.f32], M: i32,
              N: i32, K: i32, FMT: Const[int], WT: Const[pk.dtype], SB: Const[int],
              BOXB: Const[int], RAW: Const[int], BN: Const[int], STAGES: Const[int],
              GROUP_M: Const[int], PINGPONG: Const[int], EPI: Const[int], BMQ: Const[int]):
    """ta: A (M x K f16, box BMQ x 64, 128-byte swizzle); tw: W's rows as u32 words (box BN x
    BOXB / 4, no swizzle); tc: C's map for EPI > 0 (as gemm_tn's), c: C for EPI == 0. FMT: the
    ggml type id, WT: decode8's word type for it, SB: bytes of SLAB values, BOXB: the bytes
    of a row's box (SB plus the largest 16-byte misalignment, whole 16 bytes), RAW: raw
    slots, BMQ: tile rows (128: gemm_hopper's consumers; 256: consume_wide). K % SLAB == 0."""
    bars = pk.shared_array(u64, 2 * STAGES + 2 + 2 * RAW)
    smem = pk.dynamic_shared(pk.u16)
    base = swizzle_base(smem)
    raw0 = base + STAGES * (BMQ + BN) * BK + CONSUMER_WARPS * EPI * EPI_BOX_BYTES // 2
    t = pk.thread_idx.x
    if t == 0:
        for s in pk.static_range(STAGES):
            pk.mbarrier_init(bars, s, 1 + DEQUANT_THREADS)
            pk.mbarrier_init(bars, STAGES + s, 128 if PINGPONG else 256)
        for h in pk.static_range(2):
            pk.mbarrier_init(bars, 2 * STAGES + h, 128)
        for r in pk.static_range(RAW):
            pk.mbarrier_init(bars, 2 * STAGES + 2 + r, 1)
            pk.mbarrier_init(bars, 2 * STAGES + 2 + RAW + r, DEQUANT_THREADS)
        pk.fence_mbarrier_init()
    pk.syncthreads()
    k_tiles = K // BK
    tiles_m, tiles_n = (M + BMQ - 1) // BMQ, (N + BN - 1) // BN
    if t < 128:
        pk.setmaxnreg_dec(PRODUCER_REGS)
        if t == 0:
            produce(smem, base, bars, ta, ta, tiles_m, tiles_n, k_tiles, BN, STAGES, GROUP_M, BMQ,
                    False)
        elif t >= 32:
            dequantize(smem, base, raw0, bars, tiles_m, tiles_n, K // SLAB, FMT, WT, BN,
                       STAGES, GROUP_M, SB, BOXB, RAW, BMQ, tw)
    else:
        pk.setmaxnreg_inc(CONSUMER_REGS)
        if BMQ == BM:
            consume(smem, base, bars, tc, c, M, N, k_tiles, tiles_m, tiles_n, pk.f32, "f16",
                    BN, STAGES, GROUP_M, PINGPONG, EPI)
        else:
            consume_wide(smem, base, bars, tc, c, M, N, k_tiles, tiles_m, tiles_n, BN, STAGES,
                         GROUP_M, EPI)


@pk.func
def consume_wide(smem, base: i32, bars, tc, c, M: i32, N: i32, k_tiles: i32, tiles_m: i32,
                 tiles_n: i32, BN: Const[int], STAGES: Const[int], GROUP_M: Const[int],
                 EPI: Const[int]):
    """256-row tiles: both consumer warpgroups take every tile of the block, 128 rows each
    (warpgroup wg rows 128 wg.., two m64nBN accumulators), so each dequantized B slice feeds
    twice the rows of gemm_hopper's tiles. gemm_hopper's mainloop with its ping-pong
    accumulators over 256-row slots (A_ROWS); its turn hand-over arrivals (order[]) have no
    waiter here. The epilogue as gemm_hopper's (store_rows), buffers after the wider ring."""
    acc0 = pk.local_array(pk.f32, BN // 2)
    acc1 = pk.local_array(pk.f32, BN // 2)
    t = pk.thread_idx.x
    wg = t // 128 - 1
    w = (t % 128) // 32
    stage = pk.dynamic_shared(pk.f32)
    buf0 = 2 * base + STAGES * (2 * BM + BN) * BK * 2 + (t // 32 - 4) * EPI * EPI_BOX_BYTES
    e = 0
    it = 0
    for tile in range(pk.block_idx.x, tiles_m * tiles_n, pk.grid_dim.x):
        m0, n0 = tile_origin(tile, tiles_m, tiles_n, BN, GROUP_M)
        it = mainloop(acc0, acc1, smem, base, bars, it, k_tiles, 2 * wg, wg, "f16", BN,
                      STAGES, 1, A_ROWS=2 * BM)
        row0 = 2 * m0 + 128 * wg + 16 * w
        e = store_rows(acc0, c, stage, buf0, e, tc, row0, n0, M, N, pk.f32, BN, EPI)
        e = store_rows(acc1, c, stage, buf0, e, tc, row0 + 64, n0, M, N, pk.f32, BN, EPI)
    if EPI > 0 and t % 32 == 0:
        pk.bulk_wait_group(0)                             # C written, buffers free to exit
