"""pk.bulk_copy and the mbarriers: a per-warp ring fed by bulk copies (one lane issues, every
lane waits on the stage's phase), bytes landing before they are expected, and a producer warp
feeding the other warps give the same result on the CPU target and the GPU; ptxas accepts the
PTX for every arch >= sm_90; misuse is a compile error, a misaligned runtime size and a wait that
can never complete are runtime errors on the CPU target."""

import numpy as np
import pytest

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32, u64
from pykernel.errors import KernelRuntimeError, KernelSourceError

BULK_ARCHS = [a for a in pk.SUPPORTED_ARCHS if int(a[3:]) >= 90]
CHUNK = 128   # words (512 bytes) per chunk


@pk.kernel
def bulk_ring_sum(src: Ptr[u32, "ro"], out: Ptr[u32], chunks: i32, split: i32, S: Const[int],
                  LATE_EXPECT: Const[bool]):
    """Each warp streams `chunks` chunks of its slice of src through S stages; a chunk lands as
    two copies (split and 512 - split bytes, issued by lanes 0 and 31); lane l adds word
    127 - l of chunk c times c + 1. LATE_EXPECT: the expected bytes are announced after the
    copies were issued (the tx-count goes below zero first)."""
    warp = pk.thread_idx.x // 32
    lane = pk.lane_id()
    sm = pk.shared_array(u32, 4 * S * CHUNK)
    bars = pk.shared_array(u64, 4 * S)
    ring = warp * S * CHUNK
    first = warp * chunks * CHUNK
    if lane == 0:
        for s in pk.static_range(S):
            pk.mbarrier_init(bars, warp * S + s, 1)
        pk.fence_mbarrier_init()
    pk.syncwarp()
    acc = u32(0)
    for c in range(-(S - 1), chunks):
        ahead = c + S - 1
        stage = ahead % S
        if ahead < chunks and (lane == 0 or lane == 31):
            if lane == 0 and not LATE_EXPECT:
                pk.mbarrier_arrive_expect_tx(bars, warp * S + stage, 4 * CHUNK)
            off = 0 if lane == 0 else split // 4
            size = split if lane == 0 else 4 * CHUNK - split
            pk.bulk_copy(sm, ring + stage * CHUNK + off, src, first + ahead * CHUNK + off,
                         size, bars, warp * S + stage)
            if lane == 0 and LATE_EXPECT:
                pk.mbarrier_arrive_expect_tx(bars, warp * S + stage, 4 * CHUNK)
        if c >= 0:
            pk.mbarrier_wait(bars, warp * S + c % S, (c // S) % 2)
            acc += sm[ring + (c % S) * CHUNK + (CHUNK - 1 - lane)] * u32(c + 1)
        pk.syncwarp()          # stage c % S is read before it is refilled
    out[pk.thread_idx.x] = acc


def expected(x, chunks):
    x = x.reshape(4, chunks, CHUNK).astype(np.uint64)
    weights = np.arange(1, chunks + 1, dtype=np.uint64)[None, :, None]
    return (x[:, :, CHUNK - 1 - np.arange(32)] * weights).sum(axis=1).astype(np.uint32).ravel()


@pytest.mark.parametrize("stages,late", [(1, False), (2, False), (3, True), (4, False)])
def test_bulk_copy_ring(device, rng, seed, stages, late):
    chunks = int(rng.integers(1, 8))
    split = 16 * int(rng.integers(1, 32))
    x = rng.integers(0, 1 << 20, 4 * chunks * CHUNK).astype(np.uint32)
    out = pk.full(128, 0xDEADBEEF, np.uint32)
    bulk_ring_sum[1, 128](pk.to_device(x), out, chunks, split, stages, late)
    assert np.array_equal(out.numpy(), expected(x, chunks)), \
        f"ring of {stages} stages, {chunks} chunks, split {split} (seed {seed})"


@pk.kernel
def producer_warp(src: Ptr[f32, "ro"], out: Ptr[f32], words: i32):
    """The last warp's lane 0 copies each of warps 0..2 its own `words` floats (one barrier per
    consumer warp, two arrivals: the producer's and the consumer's lane 0); the consumers wait
    before the producer ran (on the CPU target too: warps run in order there)."""
    warp = pk.thread_idx.x // 32
    lane = pk.lane_id()
    sm = pk.shared_array(f32, 3 * 256)
    bars = pk.shared_array(u64, 3)
    if pk.thread_idx.x < 3:
        pk.mbarrier_init(bars, pk.thread_idx.x, 2)
        pk.fence_mbarrier_init()
    pk.syncthreads()
    if warp < 3:
        if lane == 0:
            pk.mbarrier_arrive(bars, warp)
        pk.mbarrier_wait(bars, warp, 0)
        total = f32(0.0)
        for k in range(lane, words, 32):
            total += sm[256 * warp + k]
        for step in pk.static_range(5):
            total += pk.shfl_xor(total, 16 >> step)
        if lane == 0:
            out[warp] = total
    elif lane == 0:
        for w in range(3):
            pk.mbarrier_expect_tx(bars, w, 4 * words)
            pk.bulk_copy(sm, 256 * w, src, words * w, 4 * words, bars, w)
            pk.mbarrier_arrive(bars, w)


def test_bulk_copy_producer_warp(device, rng, seed):
    words = 4 * int(rng.integers(1, 65))
    x = rng.integers(-8, 8, 3 * words).astype(np.float32)     # exact sums in any order
    out = pk.full(3, np.nan, np.float32)
    producer_warp[1, 128](pk.to_device(x), out, words)
    assert np.array_equal(out.numpy(), x.reshape(3, words).sum(axis=1)), \
        f"{words} words per warp (seed {seed})"


@pytest.mark.parametrize("arch", BULK_ARCHS)
def test_bulk_copy_ptx_assembles(arch, assemble):
    ptx = bulk_ring_sum.ptx(arch, S=2, LATE_EXPECT=False)
    for instr in ("mbarrier.init.shared::cta.b64", "fence.mbarrier_init.release.cluster",
                  "mbarrier.arrive.expect_tx.shared::cta.b64",
                  "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
                  "mbarrier.try_wait.parity.shared::cta.b64"):
        assert instr in ptx
    assert ".version 7" not in ptx          # PTX ISA 8.0 or newer
    assemble(ptx, arch)
    assemble(producer_warp.ptx(arch), arch)


@pk.kernel
def hang(out: Ptr[u32]):
    bars = pk.shared_array(u64, 1)
    if pk.thread_idx.x == 0:
        pk.mbarrier_init(bars, 0, 65)
    pk.syncthreads()
    pk.mbarrier_arrive(bars, 0)        # 64 arrivals of the 65 needed:
    pk.mbarrier_wait(bars, 0, 0)       # phase 0 never completes
    out[pk.thread_idx.x] = u32(1)


@pk.kernel
def odd_runtime_size(src: Ptr[u32, "ro"], out: Ptr[u32], nbytes: i32):
    sm = pk.shared_array(u32, 64)
    bars = pk.shared_array(u64, 1)
    pk.mbarrier_init(bars, 0, 1)
    pk.mbarrier_arrive_expect_tx(bars, 0, nbytes)
    pk.bulk_copy(sm, 0, src, 0, nbytes, bars, 0)
    pk.mbarrier_wait(bars, 0, 0)
    out[0] = sm[0]


def test_bulk_copy_runtime_errors_on_cpu():
    pk.set_device("cpu")
    with pytest.raises(KernelRuntimeError, match="mbarrier wait that can never complete"):
        hang[1, 64](pk.zeros(64, np.uint32))
    src = pk.to_device(np.arange(64, dtype=np.uint32))
    with pytest.raises(KernelRuntimeError, match="not a multiple of 16 bytes"):
        odd_runtime_size[1, 1](src, pk.zeros(1, np.uint32), 24)
    with pytest.raises(KernelRuntimeError, match="out-of-bounds"):
        odd_runtime_size[1, 1](src, pk.zeros(1, np.uint32), 512)
    out = pk.zeros(1, np.uint32)
    src = pk.to_device(np.arange(7, 71, dtype=np.uint32))
    odd_runtime_size[1, 1](src, out, 32)
    assert out.numpy()[0] == 7


@pk.kernel
def literal_odd_size(src: Ptr[u32, "ro"], out: Ptr[u32]):
    sm = pk.shared_array(u32, 64)
    bars = pk.shared_array(u64, 1)
    pk.bulk_copy(sm, 0, src, 0, 24, bars, 0)
    out[0] = sm[0]


@pk.kernel
def to_global(src: Ptr[u32, "ro"], out: Ptr[u32]):
    bars = pk.shared_array(u64, 1)
    pk.bulk_copy(out, 0, src, 0, 16, bars, 0)


@pk.kernel
def from_shared(out: Ptr[u32]):
    sm = pk.shared_array(u32, 64)
    other = pk.shared_array(u32, 64)
    bars = pk.shared_array(u64, 1)
    pk.bulk_copy(sm, 0, other, 0, 16, bars, 0)
    out[0] = sm[0]


@pk.kernel
def u32_barrier(out: Ptr[u32]):
    bars = pk.shared_array(u32, 2)
    pk.mbarrier_init(bars, 0, 1)


@pk.kernel
def zero_count(out: Ptr[u32]):
    bars = pk.shared_array(u64, 1)
    pk.mbarrier_init(bars, 0, 0)


@pk.kernel
def float_bytes(out: Ptr[u32], n: f32):
    bars = pk.shared_array(u64, 1)
    pk.mbarrier_expect_tx(bars, 0, n)


@pytest.mark.parametrize("kernel,message", [
    (literal_odd_size, "positive multiple of 16, got 24"),
    (to_global, "dst must be a pk.shared_array"),
    (from_shared, "src must be a kernel pointer"),
    (u32_barrier, "must be a u64 in shared memory"),
    (zero_count, "count must be at least 1"),
    (float_bytes, "nbytes must be an i32 or u32"),
])
def test_bulk_copy_misuse_is_a_source_error(kernel, message):
    with pytest.raises(KernelSourceError, match=message):
        kernel.ptx("sm_90")


@pytest.mark.parametrize("arch", ["sm_80", "sm_89"])
def test_bulk_copy_needs_sm90(arch):
    with pytest.raises(KernelSourceError, match="needs sm_90"):
        bulk_ring_sum.ptx(arch, S=2, LATE_EXPECT=False)
    with pytest.raises(KernelSourceError, match="mbarrier needs sm_90"):
        hang.ptx(arch)


@pk.kernel
def prefetch_then_sum(src: Ptr[u32, "ro"], out: Ptr[u32], words: i32, nbytes: i32):
    """Lane 0 prefetches src's first nbytes into L2, then every thread sums its words: the
    hint changes no result."""
    if pk.thread_idx.x == 0:
        pk.bulk_prefetch_l2(src, 0, nbytes)
    acc = u32(0)
    for i in range(pk.thread_idx.x, words, pk.block_dim.x):
        acc += src[i]
    out[pk.thread_idx.x] = acc


def test_bulk_prefetch_l2_changes_no_result(device, rng, seed):
    words = 4 * int(rng.integers(4, 2048))
    x = rng.integers(0, 1 << 20, words).astype(np.uint32)
    out = pk.full(64, 0xDEADBEEF, np.uint32)
    prefetch_then_sum[1, 64](pk.to_device(x), out, words, 4 * words)
    want = np.array([x[t::64].astype(np.uint64).sum() for t in range(64)]).astype(np.uint32)
    assert np.array_equal(out.numpy(), want), f"{words} words (seed {seed})"


@pytest.mark.parametrize("arch", BULK_ARCHS)
def test_bulk_prefetch_l2_ptx_assembles(arch, assemble):
    ptx = prefetch_then_sum.ptx(arch)
    assert "cp.async.bulk.prefetch.L2.global" in ptx
    assert ".version 7" not in ptx
    assemble(ptx, arch)


def test_bulk_prefetch_l2_runtime_errors_on_cpu():
    pk.set_device("cpu")
    src = pk.to_device(np.arange(64, dtype=np.uint32))
    out = pk.zeros(64, np.uint32)
    with pytest.raises(KernelRuntimeError, match="not a multiple of 16 bytes"):
        prefetch_then_sum[1, 64](src, out, 64, 24)
    with pytest.raises(KernelRuntimeError, match="out-of-bounds"):
        prefetch_then_sum[1, 64](src, out, 64, 512)


@pk.kernel
def prefetch_odd_size(src: Ptr[u32, "ro"]):
    pk.bulk_prefetch_l2(src, 0, 40)


@pk.kernel
def prefetch_shared(out: Ptr[u32]):
    sm = pk.shared_array(u32, 64)
    pk.bulk_prefetch_l2(sm, 0, 16)


@pytest.mark.parametrize("kernel,message", [
    (prefetch_odd_size, "positive multiple of 16, got 40"),
    (prefetch_shared, "prefetches global memory"),
])
def test_bulk_prefetch_l2_misuse_is_a_source_error(kernel, message):
    with pytest.raises(KernelSourceError, match=message):
        kernel.ptx("sm_90")
    with pytest.raises(KernelSourceError, match="cp.async.bulk.prefetch needs sm_90"):
        prefetch_then_sum.ptx("sm_80")
