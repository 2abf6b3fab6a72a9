"""pk.mma_m16n8k128_b1 (1-bit AND-popcount tensor-core tile): the CPU target's emulation and the
GPU against a numpy model of the PTX ISA fragment layout, ptxas for every arch >= sm_80, and
the arch error below sm_80."""

import numpy as np
import pytest

import pykernel as pk
from pykernel import Ptr, i32, u32

MMA_ARCHS = [a for a in pk.SUPPORTED_ARCHS if int(a[3:]) >= 80]


@pk.kernel
def bmma_tiles(a: Ptr[u32, "ro"], b: Ptr[u32, "ro"], c: Ptr[i32, "ro"], d: Ptr[i32]):
    """Each warp: lane L reads its fragments a[2i], a[2i+1], b[i], c[4i..4i+3] (i = thread)
    and writes d[4i..4i+3]."""
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    d0, d1, d2, d3 = pk.mma_m16n8k128_b1(a[2 * i], a[2 * i + 1], b[i], c[4 * i], c[4 * i + 1],
                                         c[4 * i + 2], c[4 * i + 3])
    d[4 * i] = d0
    d[4 * i + 1] = d1
    d[4 * i + 2] = d2
    d[4 * i + 3] = d3


def reference(a_frag, b_frag, c_frag):
    """The PTX ISA layout (lane = 4 group + t): a0 bit i = A[group][32t + i], a1 row group + 8;
    b0 bit i = B[32t + i][group]; c/d: c0, c1 = (group, 2t), (group, 2t + 1), c2, c3 rows + 8.
    Builds the bit matrices A (16 x 128), B (128 x 8), C (16 x 8), returns D's fragments."""
    warps = a_frag.shape[0]
    d_frag = np.empty_like(c_frag)
    for w in range(warps):
        A = np.zeros((16, 128), np.int64)
        B = np.zeros((128, 8), np.int64)
        C = np.zeros((16, 8), np.int64)
        for lane in range(32):
            g, t = divmod(lane, 4)
            bits = (np.arange(32), 32 * t + np.arange(32))
            for half in range(2):
                A[g + 8 * half, bits[1]] = (int(a_frag[w, lane, half]) >> bits[0]) & 1
            B[bits[1], g] = (int(b_frag[w, lane]) >> bits[0]) & 1
            for k in range(4):
                C[g + 8 * (k // 2), 2 * t + k % 2] = c_frag[w, lane, k]
        D = C + A @ B
        for lane in range(32):
            g, t = divmod(lane, 4)
            for k in range(4):
                d_frag[w, lane, k] = D[g + 8 * (k // 2), 2 * t + k % 2]
    return d_frag


def test_mma_b1_matches_the_fragment_model(device, rng, seed):
    warps = 2
    a = rng.integers(0, 1 << 32, size=(warps, 32, 2), dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 1 << 32, size=(warps, 32), dtype=np.uint64).astype(np.uint32)
    a[0, :4, 0] = 0xFFFFFFFF        # row 0 all ones: D[0][c] = C + popc of B's column c
    c = rng.integers(-1000, 1000, size=(warps, 32, 4)).astype(np.int32)
    d = pk.full((warps * 32 * 4,), -7, np.int32, device)
    bmma_tiles[1, 32 * warps](pk.to_device(a.reshape(-1), device=device),
                              pk.to_device(b.reshape(-1), device=device),
                              pk.to_device(c.reshape(-1), device=device), d)
    got = d.numpy().reshape(warps, 32, 4)
    want = reference(a, b, c)
    assert np.array_equal(got, want), f"BMMA fragments differ from the PTX layout (seed {seed})"


@pytest.mark.parametrize("arch", MMA_ARCHS)
def test_mma_b1_ptx_assembles(arch, assemble):
    ptx = bmma_tiles.ptx(arch)
    assert "mma.sync.aligned.m16n8k128.row.col.s32.b1.b1.s32.and.popc" in ptx
    assemble(ptx, arch)


def test_mma_b1_needs_sm80():
    with pytest.raises(pk.UnsupportedArchError) as info:
        bmma_tiles.ptx("sm_75")
    assert "needs sm_80" in str(info.value) and "m16n8k128" in str(info.value)


def test_mma_b1_argument_count_is_checked():
    @pk.kernel
    def too_few(d: Ptr[i32]):
        d0, d1, d2, d3 = pk.mma_m16n8k128_b1(u32(1), u32(2), u32(3), 0, 0, 0)
        d[0] = d0
    with pytest.raises(pk.KernelSourceError, match="takes 7 arguments"):
        too_few.ptx("sm_90")
