"""A tiny wgmma GEMM: one warpgroup computes C (64 x 64, f32) = A (64 x 32, f16) . B^T
(B: 64 x 32, f16) with two k16 steps, both operands in shared memory as 8 x 16-byte core
matrices (no swizzle). Runs on the CPU target by default; on an H100/H200 the launcher
compiles it for sm_90a. Layouts: docs/language.md, "Hopper tensor cores"."""
import numpy as np

import pykernel as pk
from pykernel import Ptr, f16, f32

M, N, K = 64, 64, 32
LBO, SBO = 128, (K * 2 // 16) * 128     # core matrices: along K adjacent, 8-row groups after


@pk.kernel
def gemm(a: Ptr[f16], b: Ptr[f16], c: Ptr[f32]):
    sa = pk.shared_array(f16, M * K)
    sb = pk.shared_array(f16, N * K)
    t = pk.thread_idx.x
    for idx in range(t, M * K, 128):     # element (r, k) -> its core-matrix slot
        r, k = idx // K, idx % K
        slot = (r // 8) * SBO // 2 + (k // 8) * LBO // 2 + (r % 8) * 8 + k % 8
        sa[slot] = a[idx]
        sb[slot] = b[idx]
    pk.fence_proxy_async()
    pk.syncthreads()
    acc = pk.local_array(f32, N // 2)
    for s in pk.static_range(K // 16):   # k16 steps: 2 core matrices (256 bytes) further
        pk.wgmma_fence()
        pk.wgmma(acc, pk.wgmma_desc(sa, s * 128, LBO, SBO, 0),
                 pk.wgmma_desc(sb, s * 128, LBO, SBO, 0), "f16", s > 0)
        pk.wgmma_commit_group()
        pk.wgmma_wait_group(0, acc)
    w, g, q = t // 32, (t % 32) // 4, t % 4
    for i in pk.static_range(N // 2):
        c[(16 * w + g + 8 * ((i // 2) % 2)) * N + 8 * (i // 4) + 2 * q + i % 2] = acc[i]


def main():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((N, K)).astype(np.float16)
    c = pk.full((M * N,), np.nan, np.float32)
    gemm[1, 128](pk.to_device(a.reshape(-1)), pk.to_device(b.reshape(-1)), c)
    want = a.astype(np.float32) @ b.astype(np.float32).T
    err = np.abs(c.numpy().reshape(M, N) - want).max()
    print(f"64x64x32 wgmma GEMM on {pk.current_device()}: max |error| {err:.2e}")
    assert err < 1e-3


if __name__ == "__main__":
    main()
