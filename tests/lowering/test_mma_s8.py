"""pk.mma_m16n8k32_s8 and pk.mma_m16n8k16_s8 (int8 tensor-core tiles): the CPU target's emulation
and the GPU against a numpy model of the PTX ISA fragment layout, ptxas for every arch >= sm_80,
the arch error below sm_80 and the argument count."""

import numpy as np
import pytest

import pykernel as pk
from pykernel import Const, Ptr, i32, u32

MMA_ARCHS = [a for a in pk.SUPPORTED_ARCHS if int(a[3:]) >= 80]


@pk.kernel
def mma_s8_tiles(a: Ptr[u32, "ro"], b: Ptr[u32, "ro"], c: Ptr[i32, "ro"], d: Ptr[i32],
                 K: Const[int]):
    """Each lane i of the block reads its fragments (k32: a[4i..4i+3], b[2i], b[2i+1]; k16:
    a[2i], a[2i+1], b[i]) and c[4i..4i+3], and writes d[4i..4i+3]."""
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if K == 32:
        d0, d1, d2, d3 = pk.mma_m16n8k32_s8(a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3],
                                            b[2 * i], b[2 * i + 1], c[4 * i], c[4 * i + 1],
                                            c[4 * i + 2], c[4 * i + 3])
        pk.store_vec(d, 4 * i, (d0, d1, d2, d3))
    else:
        e0, e1, e2, e3 = pk.mma_m16n8k16_s8(a[2 * i], a[2 * i + 1], b[i], c[4 * i],
                                            c[4 * i + 1], c[4 * i + 2], c[4 * i + 3])
        pk.store_vec(d, 4 * i, (e0, e1, e2, e3))


def reference(a_frag, b_frag, c_frag, k):
    """The PTX ISA layout (lane = 4 group + t), k split into k / 16 parts p of 16: register
    2p of A holds A[group][16p + 4t .. +3] (byte e = column 16p + 4t + e), 2p + 1 the same of
    row group + 8; register p of B holds B[16p + 4t .. +3][group]; c0, c1 = (group, 2t),
    (group, 2t + 1), c2, c3 the rows + 8. Builds A (16 x k), B (k x 8), C and returns D's
    fragments."""
    parts = k // 16
    a8, b8 = (f.astype(np.uint32).view(np.int8).reshape(f.shape + (4,)) for f in (a_frag, b_frag))
    d_frag = np.empty_like(c_frag)
    for w in range(a_frag.shape[0]):
        A = np.zeros((16, k), np.int64)
        B = np.zeros((k, 8), np.int64)
        C = np.zeros((16, 8), np.int64)
        for lane in range(32):
            g, t = divmod(lane, 4)
            for p in range(parts):
                cols = 16 * p + 4 * t + np.arange(4)
                A[g, cols] = a8[w, lane, 2 * p]
                A[g + 8, cols] = a8[w, lane, 2 * p + 1]
                B[cols, g] = b8[w, lane, p]
            for e in range(4):
                C[g + 8 * (e // 2), 2 * t + e % 2] = c_frag[w, lane, e]
        D = C + A @ B
        for lane in range(32):
            g, t = divmod(lane, 4)
            for e in range(4):
                d_frag[w, lane, e] = D[g + 8 * (e // 2), 2 * t + e % 2]
    return d_frag


@pytest.mark.parametrize("k", [32, 16])
def test_mma_s8_matches_the_fragment_model(device, rng, seed, k):
    warps, parts = 2, k // 16
    a, b = (rng.integers(0, 1 << 32, size=(warps, 32, n), dtype=np.uint64).astype(np.uint32)
            for n in (2 * parts, parts))
    a[0, :4, 0] = 0x01010101       # row 0, k 0..15: ones, so D[0][n] = C + B's column sums
    b[1, :, 0] = 0x80808080        # -128 everywhere: the sign of every B byte is kept
    c = rng.integers(-1 << 20, 1 << 20, size=(warps, 32, 4)).astype(np.int32)
    d = pk.full((warps * 32 * 4,), -7, np.int32, device)
    mma_s8_tiles[1, 32 * warps](pk.to_device(a.reshape(-1), device=device),
                                pk.to_device(b.reshape(-1), device=device),
                                pk.to_device(c.reshape(-1), device=device), d, K=k)
    got = d.numpy().reshape(warps, 32, 4)
    assert np.array_equal(got, reference(a, b, c, k)), \
        f"m16n8k{k} s8 fragments differ from the PTX layout (seed {seed})"


@pytest.mark.parametrize("arch", MMA_ARCHS)
@pytest.mark.parametrize("k", [32, 16])
def test_mma_s8_ptx_assembles(arch, k, assemble):
    ptx = mma_s8_tiles.ptx(arch, K=k)
    instr = f"mma.sync.aligned.m16n8k{k}.row.col.s32.s8.s8.s32"
    assert ptx.count(instr) == 1, instr
    assemble(ptx, arch)


def test_mma_s8_needs_sm80():
    with pytest.raises(pk.UnsupportedArchError) as info:
        mma_s8_tiles.ptx("sm_75", K=16)
    assert "needs sm_80" in str(info.value) and "m16n8k16" in str(info.value)


def test_mma_m16n8k16_s8_argument_count_is_checked():
    @pk.kernel
    def too_many(d: Ptr[i32]):
        d0, d1, d2, d3 = pk.mma_m16n8k16_s8(u32(1), u32(2), u32(3), u32(4), 0, 0, 0, 0)
        d[0] = d0
    with pytest.raises(pk.KernelSourceError,
                       match=r"mma_m16n8k16_s8 takes 7 arguments: a0, a1, b0, c0..c3"):
        too_many.ptx("sm_90")
