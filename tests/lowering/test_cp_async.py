"""pk.cp_async / cp_async_commit / cp_async_wait / syncwarp: a copy ring that streams chunks
through shared memory, and 4/8-byte copies that zero-fill past src_size, give the same result
on the CPU target and the GPU; ptxas accepts them for every arch >= sm_80; misuse is a compile
error naming the problem."""

import numpy as np
import pytest

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u16, u32
from pykernel.errors import KernelSourceError

ASYNC_ARCHS = [a for a in pk.SUPPORTED_ARCHS if int(a[3:]) >= 80]
CHUNK = 128   # words: 32 lanes x 16 bytes


@pk.kernel
def ring_weighted_sum(src: Ptr[u32, "ro"], out: Ptr[u32], chunks: i32, S: Const[int]):
    """Each warp streams `chunks` chunks of its own slice of src through a ring of S stages in
    shared memory; lane l adds word 127 - l of chunk c times c + 1 (it reads what other lanes
    copied, so the wait and the warp barrier matter)."""
    warp = pk.thread_idx.x // 32
    lane = pk.lane_id()
    sm = pk.shared_array(u32, 4 * S * CHUNK)       # 4 warps
    ring = warp * S * CHUNK
    first = warp * chunks * CHUNK
    for s in pk.static_range(S - 1):
        if s < chunks:
            pk.cp_async(sm, ring + s * CHUNK + 4 * lane, src, first + s * CHUNK + 4 * lane)
        pk.cp_async_commit()
    acc = u32(0)
    for c in range(chunks):
        ahead = c + S - 1
        if ahead < chunks:
            pk.cp_async(sm, ring + (ahead % S) * CHUNK + 4 * lane, src,
                        first + ahead * CHUNK + 4 * lane)
        pk.cp_async_commit()
        pk.cp_async_wait(S - 1)
        pk.syncwarp()
        acc += sm[ring + (c % S) * CHUNK + (CHUNK - 1 - lane)] * u32(c + 1)
        pk.syncwarp()          # stage c % S is read before it is refilled
    out[pk.thread_idx.x] = acc


def expected(x, chunks):
    x = x.reshape(4, chunks, CHUNK).astype(np.uint64)
    weights = np.arange(1, chunks + 1, dtype=np.uint64)[None, :, None]
    return (x[:, :, CHUNK - 1 - np.arange(32)] * weights).sum(axis=1).astype(np.uint32).ravel()


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_cp_async_ring(device, rng, seed, stages):
    chunks = int(rng.integers(1, 7))
    x = rng.integers(0, 1 << 20, 4 * chunks * CHUNK).astype(np.uint32)
    out = pk.full(128, 0xDEADBEEF, np.uint32)
    ring_weighted_sum[1, 128](pk.to_device(x), out, chunks, stages)
    assert np.array_equal(out.numpy(), expected(x, chunks)), \
        f"ring of {stages} stages, {chunks} chunks (seed {seed})"


@pk.kernel
def words_of_halves(src: Ptr[u16, "ro"], out: Ptr[u32], total: u32, SIZE: Const[int]):
    """Thread i copies the SIZE bytes at byte SIZE * i of a u16 buffer of `total` bytes into
    shared u32 words, reading only the bytes that exist (the rest zero), and writes them out."""
    sm = pk.shared_array(u32, 256)
    i = pk.thread_idx.x
    byte = u32(SIZE) * u32(i)
    left = total - min(byte, total)
    words = SIZE // 4
    if left > u32(0):
        pk.cp_async(sm, words * i, src, i32(byte // u32(2)), SIZE, src_size=min(left, u32(SIZE)))
    pk.cp_async_commit()
    pk.cp_async_wait(0)
    for k in pk.static_range(SIZE // 4):
        out[words * i + k] = sm[words * i + k] if left > u32(0) else u32(0)


@pytest.mark.parametrize("size", [4, 8])
def test_cp_async_small_copies_zero_fill(device, rng, seed, size):
    # a u16 buffer whose byte count is not a multiple of the copy size: the last copy reads
    # only what exists (src_size) and zero-fills the rest
    halves = int(rng.integers(3, 60)) * 2 + 1
    x = rng.integers(0, 1 << 16, halves).astype(np.uint16)
    threads = -(-2 * halves // size)
    out = pk.full(threads * size // 4, 0xDEADBEEF, np.uint32)
    words_of_halves[1, threads](pk.to_device(x), out, 2 * halves, size)
    padded = np.zeros(threads * size // 2, np.uint16)
    padded[:halves] = x
    assert np.array_equal(out.numpy(), padded.view(np.uint32)), f"size {size} (seed {seed})"


@pytest.mark.parametrize("arch", ASYNC_ARCHS)
def test_cp_async_ptx_assembles(arch, assemble):
    ptx = ring_weighted_sum.ptx(arch, S=3)
    for instr in ("cp.async.cg.shared.global", "cp.async.commit_group", "cp.async.wait_group 2",
                  "bar.warp.sync -1"):
        assert instr in ptx
    assemble(ptx, arch)


def test_cp_async_needs_sm80():
    with pytest.raises(KernelSourceError, match="cp.async needs sm_80"):
        ring_weighted_sum.ptx("sm_75", S=2)


@pk.kernel
def copy_from_shared(dst: Ptr[u32], n: i32):
    sm = pk.shared_array(u32, 64)
    other = pk.shared_array(u32, 64)
    pk.cp_async(sm, 0, other, 0)
    dst[0] = sm[n]


@pk.kernel
def copy_to_global(src: Ptr[u32, "ro"], dst: Ptr[u32]):
    pk.cp_async(dst, 0, src, 0)


@pk.kernel
def odd_size(src: Ptr[f32, "ro"], dst: Ptr[f32]):
    sm = pk.shared_array(f32, 64)
    pk.cp_async(sm, 0, src, 0, 12)
    dst[0] = sm[0]


@pk.kernel
def wait_runtime(src: Ptr[u32, "ro"], n: i32):
    pk.cp_async_wait(n)


@pytest.mark.parametrize("kernel,message", [
    (copy_from_shared, "src must be a kernel pointer"),
    (copy_to_global, "dst must be a pk.shared_array"),
    (odd_size, "size must be a compile-time 4, 8 or 16"),
    (wait_runtime, "n must be a compile-time int 0..7"),
])
def test_cp_async_misuse_is_a_source_error(kernel, message):
    with pytest.raises(KernelSourceError, match=message):
        kernel.ptx("sm_90")
