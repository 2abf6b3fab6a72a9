"""pk.ldmatrix: warp loads of 8x8 16-bit tiles from shared memory in mma fragment layout, on
the CPU target and the GPU, plus its compile-time errors."""

import numpy as np
import pytest

import pykernel as pk
from pykernel import KernelRuntimeError, KernelSourceError, Ptr, i32, u16, u32

ROWS, COLS = 32, 24          # the shared array: rows of 24 halves (48 bytes, 16-byte aligned)


@pk.kernel
def load_tiles(src: Ptr[u16, "ro"], out: Ptr[u32], col: i32, row_shift: i32,
               N: pk.Const[int], TRANS: pk.Const[int]):
    """Each warp copies the array to shared memory, then tile j = rows 8j + row_shift .. of
    columns col .. col + 7 (lane l gives row l % 8 of tile l // 8); word j of lane l -> out."""
    tile = pk.shared_array(u16, ROWS * COLS)
    lane = pk.thread_idx.x % 32
    warp = pk.thread_idx.x // 32
    if warp == 0:
        for i in range(lane, ROWS * COLS, 32):
            tile[i] = src[i]
    pk.syncthreads()
    row = (lane % (8 * N) + row_shift) % ROWS
    r = pk.ldmatrix(tile, row * COLS + col, N, trans=TRANS != 0)
    base = warp * 32 * N
    if N == 1:
        out[base + lane] = r
    else:
        for j in pk.static_range(N):
            out[base + j * 32 + lane] = r[j]


def expected(a, n, col, row_shift, trans):
    """(n, 32, 2) halves per lane, from the PTX ISA's fragment layout."""
    rows = (np.arange(8 * n) + row_shift) % ROWS
    tiles = a[rows, col:col + 8].reshape(n, 8, 8)
    if trans:
        tiles = tiles.transpose(0, 2, 1)
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    return np.stack([tiles[:, g, 2 * t], tiles[:, g, 2 * t + 1]], axis=-1)


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("trans", [0, 1])
def test_ldmatrix_fragments(device, rng, n, trans):
    a = rng.integers(0, 1 << 16, size=(ROWS, COLS), dtype=np.uint16)
    src = pk.to_device(a.reshape(-1), device=device)
    warps = 2
    for col, shift in ((8, 0), (16, 5)):
        out = pk.full((warps * 32 * n,), 0xDEADBEEF, np.uint32, device)
        load_tiles[1, 32 * warps](src, out, col, shift, n, trans)
        got = out.numpy().view(np.uint16).reshape(warps, n, 32, 2)
        for w in range(warps):
            np.testing.assert_array_equal(got[w], expected(a, n, col, shift, trans))


def test_ldmatrix_row_out_of_bounds_on_cpu():
    pk.set_device("cpu")
    src = pk.to_device(np.zeros(ROWS * COLS, np.uint16))
    with pytest.raises(KernelRuntimeError, match="out-of-bounds ldmatrix"):
        load_tiles[1, 32](src, pk.zeros(128, np.uint32), COLS - 4, 0, 4, 0)


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
def test_ldmatrix_ptx_assembles(arch, assemble):
    for n in (1, 2, 4):
        for trans in (0, 1):
            ptx = load_tiles.ptx(arch, N=n, TRANS=trans)
            op = f"ldmatrix.sync.aligned.m8n8.x{n}{'.trans' if trans else ''}.shared.b16"
            assert op in ptx
            # ldmatrix needs PTX ISA 6.5: sm_75's module rises from its default 6.3
            assert ".version 6.3\n" not in ptx
            assemble(ptx, arch)


@pk.kernel
def from_global(src: Ptr[u16, "ro"], out: Ptr[u32]):
    out[0] = pk.ldmatrix(src, 0, 1)


@pk.kernel
def three_tiles(out: Ptr[u32]):
    tile = pk.shared_array(u16, 256)
    a, b, c = pk.ldmatrix(tile, 0, 3)
    out[0] = a


@pk.kernel
def runtime_trans(out: Ptr[u32], flag: i32):
    tile = pk.shared_array(u16, 256)
    out[0] = pk.ldmatrix(tile, 0, 1, trans=flag)


@pytest.mark.parametrize("kernel,message", [
    (from_global, "tile must be a pk.shared_array"),
    (three_tiles, "must be a compile-time 1, 2 or 4"),
    (runtime_trans, "trans must be a compile-time bool"),
])
def test_ldmatrix_misuse_is_a_source_error(kernel, message):
    with pytest.raises(KernelSourceError, match=message):
        kernel.ptx("sm_90")
