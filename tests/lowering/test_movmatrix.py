"""pk.movmatrix: warp-wide 8x8 transpose of 16-bit values, on the CPU target and the GPU."""

import numpy as np
import pytest

import pykernel as pk
from pykernel import Ptr, u32


@pk.kernel
def transpose_tiles(words: Ptr[u32, "ro"], out: Ptr[u32]):
    """Each warp transposes its own 8x8 tile: word (lane) = row lane // 4, columns 2(lane % 4)."""
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    out[i] = pk.movmatrix(words[i])


def test_movmatrix_transposes_each_warp_tile(device, rng):
    warps = 3
    tiles = rng.integers(0, 1 << 16, size=(warps, 8, 8), dtype=np.uint16)
    words = pk.to_device(tiles.reshape(warps, 32, 2).view(np.uint32).reshape(-1), device=device)
    out = pk.full((warps * 32,), 0xDEADBEEF, np.uint32, device)
    transpose_tiles[1, 32 * warps](words, out)
    got = out.numpy().view(np.uint16).reshape(warps, 8, 8)
    np.testing.assert_array_equal(got, tiles.transpose(0, 2, 1))


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
def test_movmatrix_ptx_assembles(arch, assemble):
    ptx = transpose_tiles.ptx(arch)
    assert "movmatrix.sync.aligned.m8n8.trans.b16" in ptx
    assemble(ptx, arch)
