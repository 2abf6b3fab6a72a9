"""A TMA-fed wgmma GEMM: one warpgroup computes C (64 x N, f32) = A (64 x K, f16) . B^T
(B: N x K, f16). Thread 0 loads 64-wide K slices of A and B by TMA into 128-byte-swizzled
shared memory, two stages deep (the next slice lands while wgmma reads this one, each stage
with its mbarrier); the warpgroup multiplies through 128B-swizzle descriptors; C leaves by one
TMA store. Runs on the CPU target by default; on an H100/H200 the launcher compiles it for
sm_90a. Layouts and the PTX of each call: docs/language.md, "TMA tensor copies"."""
import numpy as np

import pykernel as pk
from pykernel import Const, f16, f32, i32, u64

M, N, KT = 64, 48, 64           # tile: all of M and N, 64 f16 of K (one 128-byte atom) a step
STAGES = 2


@pk.kernel
def gemm(ta: pk.TensorMap, tb: pk.TensorMap, tc: pk.TensorMap, k_tiles: i32,
         N_: Const[int]):
    sa = pk.shared_array(f16, STAGES * M * KT, align=1024)   # stage s at s * 8 KiB
    sb = pk.shared_array(f16, STAGES * N_ * KT, align=1024)   # 40 KiB in all: static limit 48
    sc = pk.shared_array(f32, M * N_, align=128)
    full = pk.shared_array(u64, STAGES)
    t = pk.thread_idx.x
    stage_bytes = (M + N_) * KT * 2
    if t == 0:
        for s in pk.static_range(STAGES):
            pk.mbarrier_init(full, s, 1)
        pk.fence_mbarrier_init()
        for s in pk.static_range(STAGES):              # prologue: the first two slices
            if s < k_tiles:
                pk.mbarrier_arrive_expect_tx(full, s, stage_bytes)
                pk.tma_load(sa, s * M * KT, ta, (0, s * KT), full, s)
                pk.tma_load(sb, s * N_ * KT, tb, (0, s * KT), full, s)
    pk.syncthreads()
    acc = pk.local_array(f32, N_ // 2)
    for i in pk.static_range(N_ // 2):
        acc[i] = 0.0
    for kt in range(k_tiles):
        s = kt % STAGES
        pk.mbarrier_wait(full, s, (kt // STAGES) % 2)
        for k in pk.static_range(KT // 16):            # k16 steps: 32 bytes along the atom
            pk.wgmma_fence()
            pk.wgmma(acc, pk.wgmma_desc(sa, s * M * KT + 16 * k, 16, 1024, 128),
                     pk.wgmma_desc(sb, s * N_ * KT + 16 * k, 16, 1024, 128), "f16", 1)
        pk.wgmma_commit_group()
        pk.wgmma_wait_group(0, acc)
        pk.syncthreads()                               # every warp is done with stage s
        if t == 0 and kt + STAGES < k_tiles:           # refill it with slice kt + 2
            nxt = kt + STAGES
            pk.mbarrier_arrive_expect_tx(full, s, stage_bytes)
            pk.tma_load(sa, s * M * KT, ta, (0, nxt * KT), full, s)
            pk.tma_load(sb, s * N_ * KT, tb, (0, nxt * KT), full, s)
    w, g, q = t // 32, (t % 32) // 4, t % 4
    for i in pk.static_range(N_ // 2):                 # accumulators -> row-major C tile
        sc[(16 * w + g + 8 * ((i // 2) % 2)) * N_ + 8 * (i // 4) + 2 * q + i % 2] = acc[i]
    pk.fence_proxy_async()                             # generic-proxy writes before TMA reads
    pk.syncthreads()
    if t == 0:
        pk.tma_store(tc, (0, 0), sc, 0)
        pk.bulk_commit_group()
        pk.bulk_wait_group(0)


def main(k: int = 296):
    """k: a multiple of 8 (TMA's 16-byte row strides); the last slice reads zeros past k."""
    rng = np.random.default_rng(0)
    a = (rng.integers(-8, 9, (M, k)) / 4).astype(np.float16)
    b = (rng.integers(-8, 9, (N, k)) / 4).astype(np.float16)
    c = pk.full((M, N), np.nan, np.float32)
    ta = pk.tensor_map(pk.to_device(a), (M, KT), swizzle=128)
    tb = pk.tensor_map(pk.to_device(b), (N, KT), swizzle=128)
    tc = pk.tensor_map(c, (M, N))
    gemm[1, 128](ta, tb, tc, (k + KT - 1) // KT, N)
    want = a.astype(np.float32) @ b.astype(np.float32).T      # exact: quarters, f32 sums
    err = np.abs(c.numpy() - want).max()
    print(f"{M}x{N}x{k} TMA + wgmma GEMM on {pk.current_device()}: max |error| {err:.2e}")
    assert err == 0.0


if __name__ == "__main__":
    main()
