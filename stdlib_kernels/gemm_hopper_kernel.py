"""The kernel of stdlib_kernels.gemm_hopper (the host side, configs and docs live there):
C (M x N) = A (M x K) . B^T (B: N x K), A and B bf16 / f16 as TMA tensor maps, C f32 or bf16,
accumulated in f32 by wgmma (sm_90a; the CPU target emulates it).

A persistent grid walks the BM x BN tiles of C, 384 threads a block: warpgroup 0 produces
(thread 0 TMA-loads K slices of 64 into a ring of STAGES 128-byte-swizzled slots: A 128 x 64,
B BN x 64), warpgroups 1 and 2 consume. The Const options:

    GROUP_M   tile order: 1 row-major over tiles; G > 1 walks super-rows of G tile rows
              column by column, so the blocks running at one time share fewer A and B panels
              (their L2 footprint shrinks from ~(8 A + 16 B) panels to ~(16 A + 8 B) halves)
    PINGPONG  0: both consumers work on one tile, 64 rows each (m64nBN, one accumulator);
              1: each consumer owns every other tile of the block, all 128 rows (two m64nBN
              accumulators), so one warpgroup's epilogue overlaps the other's wgmmas
    EPI       0: accumulators straight to global (8-byte stores, row / col checked); E > 0:
              each consumer warp stages 16-row boxes of 128 bytes (32 f32 / 64 bf16 columns)
              in E buffers of its own (2 KiB each, 128-byte swizzle: conflict-free writes)
              and TMA-stores them (clipped at M and N by the map), E boxes in flight

    shared (dynamic): [pad to 1024 B] ring slot 0: A 128x64 | B BNx64, slot 1, ... |
                      epilogue: warp 0's E boxes | warp 1's | ... | warp 7's

Accumulation order: per output element, the products a[k] * b[k] (exact in f32) added to an f32
sum for k = 0, 1, ..., K - 1 on the CPU target's emulation (the tensor cores use another
order); every option gives the same bits there."""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, i32, u64

BM, BK = 128, 64
THREADS = 384                       # producer warpgroup + 2 consumer warpgroups
SWIZZLE_ALIGN = 1024                # 128-byte swizzle repeats every 8 rows of 128 B
PRODUCER_REGS, CONSUMER_REGS = 40, 232   # 128 x (40 + 2 x 232) = 384 x 168, the
#                                         block's registers (pk.entry_registers(384, 1))
EPI_BOX_ROWS, EPI_BOX_BYTES = 16, 2048   # a consumer warp's 16 rows x 128 bytes


@pk.func
def swizzle_base(smem) -> i32:
    """The element offset in dynamic shared memory `smem` (2-byte elements) of its first
    SWIZZLE_ALIGN-aligned address, where 128-byte-swizzled tiles must start: a wgmma
    descriptor's start field is the shared address >> 4."""
    addr = i32(pk.wgmma_desc(smem, 0, 16, 1024, 0) & u64(0x3FFF)) * 16
    return ((SWIZZLE_ALIGN - addr % SWIZZLE_ALIGN) % SWIZZLE_ALIGN) // 2


@pk.func
def tile_origin(tile: i32, tiles_m: i32, tiles_n: i32, BN: Const[int], GROUP_M: Const[int]):
    """(m0, n0) of the block's tile number `tile`: row-major, or grouped by GROUP_M tile rows
    (column-major inside a group; the last group may have fewer rows)."""
    m, n = tile // tiles_n, tile % tiles_n
    if GROUP_M > 1:
        per_group = GROUP_M * tiles_n
        first = (tile // per_group) * GROUP_M
        rows = min(tiles_m - first, GROUP_M)
        m, n = first + (tile % per_group) % rows, (tile % per_group) // rows
    return m * BM, n * BN


@pk.func
def produce(smem, base: i32, bars, ta, tb, tiles_m: i32, tiles_n: i32, k_tiles: i32,
            BN: Const[int], STAGES: Const[int], GROUP_M: Const[int], A_ROWS: Const[int] = 128,
            WITH_B: Const[bool] = True):
    """Thread 0 of the producer: every K slice of the block's tiles into the ring (A_ROWS x BK
    of A, then with WITH_B BN x BK of B from tb), in the order the consumers take them; slot s
    is refilled once empty[s] completed. Without B (gemm_hopper_quant: its dequantizers write
    B and arrive themselves; tb unused) only A's bytes are expected. tile_origin counts tile
    rows of BM: an A_ROWS-row tile starts at A_ROWS / BM times its row."""
    slot = (A_ROWS + BN) * BK
    it = 0
    for tile in range(pk.block_idx.x, tiles_m * tiles_n, pk.grid_dim.x):
        m0, n0 = tile_origin(tile, tiles_m, tiles_n, BN, GROUP_M)
        for kt in range(k_tiles):
            s = it % STAGES
            if it >= STAGES:                     # the consumers freed slot s
                pk.mbarrier_wait(bars, STAGES + s, (it // STAGES - 1) % 2)
            if WITH_B:
                pk.mbarrier_arrive_expect_tx(bars, s, slot * 2)
            else:
                pk.mbarrier_arrive_expect_tx(bars, s, A_ROWS * BK * 2)
            pk.tma_load(smem, base + s * slot, ta, (m0 * (A_ROWS // BM), kt * BK), bars, s)
            if WITH_B:
                pk.tma_load(smem, base + s * slot + A_ROWS * BK, tb, (n0, kt * BK), bars, s)
            it += 1


@pk.func
def mainloop(acc0, acc1, smem, base: i32, bars, it: i32, k_tiles: i32, row_half: i32,
             wg: i32, KIND: Const[str], BN: Const[int], STAGES: Const[int],
             PINGPONG: Const[int], A_ROWS: Const[int] = 128):
    """One tile's K slices from ring position `it` on: acc0 (rows 64 row_half..) or, with
    PINGPONG, acc0 / acc1 (rows 64 row_half.. / + 64) = A . B^T. One wgmma group stays in
    flight; the slot before it is released. With PINGPONG, once the last slice's wgmmas are
    issued, the other warpgroup (not wg) may start its mainloop. A_ROWS: rows of A in a ring
    slot, B after them (gemm_hopper_quant's 256-row tiles). Returns the ring position after
    the tile."""
    slot = (A_ROWS + BN) * BK
    for i in pk.static_range(BN // 2):
        acc0[i] = 0.0
        if PINGPONG:
            acc1[i] = 0.0
    for kt in range(k_tiles):
        s = it % STAGES
        pk.mbarrier_wait(bars, s, (it // STAGES) % 2)
        da = pk.wgmma_desc(smem, base + s * slot + row_half * 64 * BK, 16, 1024, 128)
        db = pk.wgmma_desc(smem, base + s * slot + A_ROWS * BK, 16, 1024, 128)
        pk.wgmma_fence()
        for k in pk.static_range(BK // 16):      # k16 steps: + 32 bytes, 2 in the
            step = u64(2 * k)                    # descriptor's address field
            pk.wgmma(acc0, da + step, db + step, KIND, 1)
            if PINGPONG:                         # rows 64..127: + 64 rows of 128 B
                pk.wgmma(acc1, da + step + u64(64 * 128 // 16), db + step, KIND, 1)
        pk.wgmma_commit_group()
        pk.wgmma_wait_group(1, acc0, acc1)       # slice it - 1's wgmmas are done
        if kt > 0:
            pk.mbarrier_arrive(bars, STAGES + (it - 1) % STAGES)
        it += 1
    if PINGPONG:
        pk.mbarrier_arrive(bars, 2 * STAGES + 1 - wg)
    pk.wgmma_wait_group(0, acc0, acc1)
    pk.mbarrier_arrive(bars, STAGES + (it - 1) % STAGES)   # the tile's last slice
    return it


@pk.func
def store_direct(acc, c, row: i32, col0: i32, M: i32, N: i32, C: Const[pk.dtype],
                 BN: Const[int]):
    """This thread's accumulators (rows row, row + 8; columns col0 + 8 j, + 1) to global C."""
    for h in pk.static_range(2):
        if row + 8 * h < M:
            out = c + (pk.i64(row + 8 * h) * pk.i64(N) + pk.i64(col0))
            for i in pk.static_range(h * 2, BN // 2, 4):
                for j in pk.static_range(2):
                    if col0 + 8 * (i // 4) + j < N:
                        out[8 * (i // 4) + j] = C(acc[i + j])


@pk.func
def store_tma(acc, stage, buf0: i32, e: i32, tc, row0: i32, n0: i32, M: i32, N: i32,
              C: Const[pk.dtype], BN: Const[int], EPI: Const[int]):
    """The warp's 16 x BN accumulators (rows row0.., columns n0..) to C, one 16 x 128-byte box
    at a time: wait until buffer e % EPI was read by its last store, fill it (128-byte
    swizzle: 16-byte chunk x of row r at chunk x ^ (r % 8)), lane 0 TMA-stores it. `stage` is
    the dynamic shared memory as C elements, buf0 the warp's first buffer (in bytes). Boxes
    wholly past M or N are skipped. Returns the running box count e."""
    size = 4 if C == pk.f32 else 2
    cols = 128 // size                                   # columns per box
    lane = pk.lane_id()
    g, q = lane // 4, lane % 4
    for j in pk.static_range(BN // cols):
        if row0 < M and n0 + j * cols < N:               # warp-uniform
            if lane == 0:
                pk.bulk_wait_group_read(EPI - 1)         # box e - EPI has left buffer e % EPI
            pk.syncwarp()
            buf = buf0 + (e % EPI) * EPI_BOX_BYTES
            for i in pk.static_range(j * cols // 2, (j + 1) * cols // 2, 2):
                r = g + 8 * ((i // 2) % 2)
                byte = (8 * ((i // 4) % (cols // 8)) + 2 * q) * size   # in the 128-byte row
                at = buf + r * 128 + (((byte // 16) ^ g) * 16 + byte % 16)
                pk.store_vec(stage, at // size, (C(acc[i]), C(acc[i + 1])))
            pk.fence_proxy_async()                       # generic writes -> the TMA's reads
            pk.syncwarp()
            if lane == 0:
                pk.tma_store(tc, (row0, n0 + j * cols), stage, buf // size)
                pk.bulk_commit_group()
            e += 1
    return e


@pk.func
def store_rows(acc, c, stage, buf0: i32, e: i32, tc, row0: i32, n0: i32, M: i32, N: i32,
               C: Const[pk.dtype], BN: Const[int], EPI: Const[int]):
    """The epilogue of one 64-row accumulator: this warp's 16 rows from row0, columns from
    n0. Returns the running box count."""
    lane = pk.lane_id()
    if EPI > 0:
        e = store_tma(acc, stage, buf0, e, tc, row0, n0, M, N, C, BN, EPI)
    else:
        store_direct(acc, c, row0 + lane // 4, n0 + 2 * (lane % 4), M, N, C, BN)
    return e


# launch bounds: 384 threads start with at most 65536 / 384 = 168 registers each, which
# setmaxnreg then moves from the producer to the consumers
@pk.kernel(max_threads=THREADS, min_blocks=1)
def gemm_tn(ta: pk.TensorMap, tb: pk.TensorMap, tc: pk.TensorMap, c: Ptr["C"], M: i32, N: i32,
            K: i32, C: Const[pk.dtype], KIND: Const[str], BN: Const[int], STAGES: Const[int],
            GROUP_M: Const[int], PINGPONG: Const[int], EPI: Const[int]):
    """tc: C's tensor map (box 16 x 128 bytes, 128-byte swizzle) when EPI > 0, else unused
    (any map); c: C itself for EPI == 0."""
    # full[s] = bars[s], empty[s] = bars[S + s]; PINGPONG: order[h] = bars[2 S + h]
    bars = pk.shared_array(u64, 2 * STAGES + 2)
    smem = pk.dynamic_shared(pk.u16)
    # the tiles start at the first 1024-byte-aligned shared address (the swizzle's repeat)
    base = swizzle_base(smem)
    t = pk.thread_idx.x
    if t == 0:
        for s in pk.static_range(STAGES):
            pk.mbarrier_init(bars, s, 1)                 # the producer's expect-tx arrival
            pk.mbarrier_init(bars, STAGES + s, 128 if PINGPONG else 256)
        for h in pk.static_range(2):
            pk.mbarrier_init(bars, 2 * STAGES + h, 128)  # the other warpgroup's arrivals
        pk.fence_mbarrier_init()
    pk.syncthreads()
    k_tiles = (K + BK - 1) // BK
    tiles_m, tiles_n = (M + BM - 1) // BM, (N + BN - 1) // BN
    if t < 128:
        pk.setmaxnreg_dec(PRODUCER_REGS)
        if t == 0:
            produce(smem, base, bars, ta, tb, tiles_m, tiles_n, k_tiles, BN, STAGES, GROUP_M)
    else:
        pk.setmaxnreg_inc(CONSUMER_REGS)
        consume(smem, base, bars, tc, c, M, N, k_tiles, tiles_m, tiles_n, C, KIND, BN, STAGES,
                GROUP_M, PINGPONG, EPI)


@pk.func
def consume(smem, base: i32, bars, tc, c, M: i32, N: i32, k_tiles: i32, tiles_m: i32,
            tiles_n: i32, C: Const[pk.dtype], KIND: Const[str], BN: Const[int],
            STAGES: Const[int], GROUP_M: Const[int], PINGPONG: Const[int], EPI: Const[int]):
    """A consumer warpgroup: its tiles' mainloops and epilogues. Cooperative: both warpgroups
    take every tile of the block, 64 rows each; PINGPONG: warpgroup h the block's tiles
    h, h + 2, ..., whose K slices sit at ring positions (2 j + h) k_tiles.., their mainloops
    in turn: warpgroup h starts its j-th once the other one issued its last (phase j - 1 + h
    of order[h]). Without that turn, warpgroup 1 would wait on full barriers phases ahead,
    where a parity wait cannot tell phase p from p - 2."""
    acc0 = pk.local_array(pk.f32, BN // 2)
    acc1 = pk.local_array(pk.f32, BN // 2 if PINGPONG else 8)
    t = pk.thread_idx.x
    wg = t // 128 - 1
    w = (t % 128) // 32                                   # rows 16 w.. of a 64-row half
    stage = pk.dynamic_shared(C)
    # this warp's epilogue buffers, after the ring (bytes; the ring is 1024-byte aligned)
    buf0 = 2 * base + STAGES * (BM + BN) * BK * 2 + (t // 32 - 4) * EPI * EPI_BOX_BYTES
    e = 0                                                 # boxes this warp stored so far
    first, step, it = pk.block_idx.x, pk.grid_dim.x, 0
    row_half = wg
    if PINGPONG:
        first, step, it, row_half = first + wg * step, 2 * step, wg * k_tiles, 0
    j = 0                                                 # this warpgroup's tiles so far
    for tile in range(first, tiles_m * tiles_n, step):
        m0, n0 = tile_origin(tile, tiles_m, tiles_n, BN, GROUP_M)
        if PINGPONG and (wg == 1 or j > 0):
            pk.mbarrier_wait(bars, 2 * STAGES + wg, (j - 1 + wg) % 2)
        it = mainloop(acc0, acc1, smem, base, bars, it, k_tiles, row_half, wg, KIND, BN,
                      STAGES, PINGPONG)
        j += 1  # noqa: SIM113 (the DSL has no enumerate)
        # the epilogue overlaps the producer's loads of the next tile's first slices (and,
        # with PINGPONG, the other warpgroup's wgmmas)
        row0 = m0 + 64 * row_half + 16 * w
        e = store_rows(acc0, c, stage, buf0, e, tc, row0, n0, M, N, C, BN, EPI)
        if PINGPONG:
            e = store_rows(acc1, c, stage, buf0, e, tc, row0 + 64, n0, M, N, C, BN, EPI)
            it += k_tiles                                 # skip the other warpgroup's tile
    if EPI > 0 and t % 32 == 0:
        pk.bulk_wait_group(0)                             # C written, buffers free to exit
