"""TMA tensor copies against numpy: 2-D and 3-D tile loads whose boxes hang over the edges
(out-of-bounds elements read as zero or NaN; shared memory starts poisoned), the shared layouts
of 32/64/128-byte swizzle, stores clipped at the edges, a multicast load into a cluster, and a
128-byte-swizzle TMA load feeding wgmma (a 64 x N x 64 f16 GEMM). Each runs on the CPU target
and, marked gpu, on a Hopper GPU."""
import numpy as np
import pytest

import pykernel as pk
from pykernel import Const, Ptr, f16, f32, i32, u8, u64


@pk.func
def expect_bytes(bar, NBYTES: Const[int]):
    """Thread 0 initialises the mbarrier bar[0] (one arrival a phase) and fences it for the
    async proxy; after the block's barrier it arrives expecting NBYTES of copies, so one
    wait on phase 0 returns once that many bytes have landed. Every thread calls it."""
    if pk.thread_idx.x == 0:
        pk.mbarrier_init(bar, 0, 1)
        pk.fence_mbarrier_init()
    pk.syncthreads()
    if pk.thread_idx.x == 0:
        pk.mbarrier_arrive_expect_tx(bar, 0, NBYTES)


@pk.kernel
def load_tile(tm: pk.TensorMap, coords: Ptr[i32], out: Ptr[u8], RANK: Const[int],
              BYTES: Const[int]):
    """One TMA load of a box of BYTES bytes at coords; the shared bytes copied out as they
    lie (swizzled or not)."""
    tile = pk.shared_array(u8, BYTES, align=1024)
    bar = pk.shared_array(u64, 1)
    t = pk.thread_idx.x
    expect_bytes(bar, BYTES)
    if t == 0:
        if RANK == 2:
            pk.tma_load(tile, 0, tm, (coords[0], coords[1]), bar, 0)
        elif RANK == 3:
            pk.tma_load(tile, 0, tm, (coords[0], coords[1], coords[2]), bar, 0)
        else:
            pk.tma_load(tile, 0, tm, (coords[0], coords[1], coords[2], coords[3], coords[4]),
                        bar, 0)
    pk.mbarrier_wait(bar, 0, 0)
    for k in range(t, BYTES, pk.block_dim.x):
        out[k] = tile[k]


def box_reference(a, start, box, fill=0):
    """a[start : start + box] with the parts outside a read as `fill`."""
    out = np.full(box, fill, a.dtype)
    src = tuple(slice(max(s, 0), min(s + b, n)) for s, b, n in zip(start, box, a.shape))
    dst = tuple(slice(r.start - s, r.stop - s) for r, s in zip(src, start))
    if all(r.stop > r.start for r in src):
        out[dst] = a[src]
    return out


def swizzle_bytes(dense: np.ndarray, swizzle: int) -> np.ndarray:
    """Where TMA puts each byte of a dense box: offset o -> o ^ ((o >> 7) & (T/16 - 1)) << 4."""
    flat = dense.reshape(-1).view(np.uint8)
    if swizzle == 0:
        return flat
    o = np.arange(flat.size)
    out = np.empty_like(flat)
    out[o ^ (((o >> 7) & (swizzle // 16 - 1)) << 4)] = flat
    return out


def _start(rng, n, b, step=1):
    """A box start: anywhere from hanging over the low edge to hanging over the high one, a
    multiple of `step` (the innermost coordinate: 16 bytes' worth of elements)."""
    return step * int(rng.integers(-(b - 1) // step, -(-n // step)))


def _run_load(a, box, start, **options):
    tm = pk.tensor_map(pk.to_device(a), box, **options)
    nbytes = int(np.prod(box)) * a.itemsize
    out = pk.full(nbytes, 0xA5, np.uint8)
    load_tile[1, 64](tm, pk.to_device(np.array(start, np.int32)), out, len(box), nbytes)
    return out.numpy()


@pytest.mark.parametrize("dtype,box", [(np.float32, (8, 16)), (np.float16, (5, 24)),
                                       (np.uint8, (3, 48))])
def test_load_2d_over_the_edges(device, rng, seed, dtype, box):
    rows, cols = int(rng.integers(20, 50)), 16 * int(rng.integers(2, 5))
    a = rng.integers(1, 100, (rows, cols)).astype(dtype)
    for _ in range(3):
        start = [_start(rng, rows, box[0]), _start(rng, cols, box[1], 16 // a.itemsize)]
        got = _run_load(a, box, start).view(dtype).reshape(box)
        assert np.array_equal(got, box_reference(a, start, box)), \
            f"{dtype.__name__} {a.shape} box {box} at {start} (seed {seed})"


def test_load_3d_and_5d_over_the_edges(device, rng, seed):
    a = rng.standard_normal((7, 9, 24)).astype(np.float16)
    box = (3, 4, 8)
    start = [_start(rng, n, b, 8 if d == 2 else 1) for d, (n, b) in enumerate(zip(a.shape, box))]
    got = _run_load(a, box, start).view(np.float16).reshape(box)
    assert np.array_equal(got, box_reference(a, start, box)), f"at {start} (seed {seed})"
    a5 = rng.standard_normal((3, 2, 4, 3, 8)).astype(np.float32)
    box5 = (2, 2, 3, 2, 4)
    start5 = [_start(rng, n, b, 4 if d == 4 else 1) for d, (n, b) in enumerate(zip(a5.shape, box5))]
    got5 = _run_load(a5, box5, start5).view(np.float32).reshape(box5)
    assert np.array_equal(got5, box_reference(a5, start5, box5)), f"at {start5} (seed {seed})"


def test_load_nan_fill(device, rng, seed):
    a = rng.standard_normal((10, 16)).astype(np.float32)
    start = [-2, 4]
    got = _run_load(a, (4, 16), start, oob_fill="nan").view(np.float32).reshape(4, 16)
    want = box_reference(a, start, (4, 16), np.nan)
    assert np.array_equal(got, want, equal_nan=True), f"seed {seed}"
    assert np.isnan(got[:2]).all() and np.isnan(got[:, 12:]).all()


@pytest.mark.parametrize("swizzle", [32, 64, 128])
def test_load_swizzled_layout(device, rng, seed, swizzle):
    """Inner box extent = the swizzle span, 16 rows: every 16-byte chunk lands where the XOR
    of the shared offset says (the pattern the wgmma descriptors of the same mode read)."""
    cols = swizzle // 2
    a = rng.integers(0, 1 << 15, (40, 3 * cols)).astype(np.uint16).view(np.float16)
    box, start = (16, cols), [int(rng.integers(-4, 36)), cols * int(rng.integers(0, 3))]
    got = _run_load(a, box, start, swizzle=swizzle)
    want = swizzle_bytes(box_reference(a, start, box), swizzle)
    assert np.array_equal(got, want), f"swizzle {swizzle} at {start} (seed {seed})"


@pk.kernel
def store_tile(tm: pk.TensorMap, src: Ptr[f32], y: i32, x: i32, BOX: Const[int]):
    """Shared <- src (BOX floats), then one TMA store of it at (y, x)."""
    tile = pk.shared_array(f32, BOX, align=128)
    t = pk.thread_idx.x
    for k in range(t, BOX, pk.block_dim.x):
        tile[k] = src[k]
    pk.fence_proxy_async()
    pk.syncthreads()
    if t == 0:
        pk.tma_store(tm, (y, x), tile, 0)
        pk.bulk_commit_group()
        pk.bulk_wait_group(0)


def test_store_clipped_at_the_edges(device, rng, seed):
    rows, cols, box = int(rng.integers(10, 30)), 32, (6, 8)
    for _ in range(3):
        # a store may hang over the far edges only (an H200 traps on negative coordinates)
        y, x = int(rng.integers(0, rows)), 4 * int(rng.integers(0, cols // 4))
        src = rng.standard_normal(box).astype(np.float32)
        dst = pk.full((rows, cols), np.nan, np.float32)
        store_tile[1, 32](pk.tensor_map(dst, box), pk.to_device(src), y, x, src.size)
        want = np.full((rows, cols), np.nan, np.float32)
        region = (slice(max(y, 0), min(y + box[0], rows)), slice(max(x, 0), min(x + box[1], cols)))
        want[region] = src[region[0].start - y:region[0].stop - y,
                           region[1].start - x:region[1].stop - x]
        assert np.array_equal(dst.numpy(), want, equal_nan=True), f"at {(y, x)} (seed {seed})"


@pk.kernel
def multicast_rows(tm: pk.TensorMap, out: Ptr[f32]):
    """Cluster of 2: block 0 loads rows 0..7 into both blocks' tiles, block 1 rows 8..15; each
    block waits for both halves and writes its tile to out[block]. (The cluster_sync between
    the copies and the waits: on the CPU target a block waiting on an mbarrier does not let
    the cluster's other blocks run.)"""
    tile = pk.shared_array(f32, 16 * 16, align=128)
    bar = pk.shared_array(u64, 1)
    t = pk.thread_idx.x
    rank = pk.cluster_rank()
    if t == 0:
        pk.mbarrier_init(bar, 0, 1)
        pk.fence_mbarrier_init()
    pk.cluster_sync()                          # both barriers are ready before any copy
    if t == 0:
        pk.mbarrier_arrive_expect_tx(bar, 0, 16 * 16 * 4)
        pk.tma_load(tile, 128 * rank, tm, (8 * rank, 0), bar, 0, multicast=3)
    pk.cluster_sync()
    pk.mbarrier_wait(bar, 0, 0)
    for k in range(t, 256, pk.block_dim.x):
        out[256 * pk.block_idx.x + k] = tile[k]
    pk.cluster_sync()                          # no block exits while copies target it


def test_multicast_into_the_cluster(device, rng, seed):
    a = rng.standard_normal((16, 16)).astype(np.float32)
    out = pk.full(512, np.nan, np.float32)
    multicast_rows[2, 64, None, 0, 2](pk.tensor_map(pk.to_device(a), (8, 16)), out)
    assert np.array_equal(out.numpy().reshape(2, 16, 16), np.stack([a, a])), f"seed {seed}"


@pk.kernel
def tma_wgmma(ta: pk.TensorMap, tb: pk.TensorMap, c: Ptr[f32], N: Const[int]):
    """C (64 x N) = A (64 x 64) . B (N x 64)^T, f16: both tiles land by TMA with 128-byte
    swizzle (rows of 64 f16 = one 128-byte atom), read by wgmma through 128B descriptors."""
    sa = pk.shared_array(f16, 64 * 64, align=1024)
    sb = pk.shared_array(f16, N * 64, align=1024)
    bar = pk.shared_array(u64, 1)
    t = pk.thread_idx.x
    expect_bytes(bar, (64 + N) * 64 * 2)
    if t == 0:
        pk.tma_load(sa, 0, ta, (0, 0), bar, 0)
        pk.tma_load(sb, 0, tb, (0, 0), bar, 0)
    pk.mbarrier_wait(bar, 0, 0)
    acc = pk.local_array(f32, N // 2)
    for s in pk.static_range(4):             # k16 steps: 32 bytes further along the atom
        pk.wgmma_fence()
        pk.wgmma(acc, pk.wgmma_desc(sa, 16 * s, 16, 1024, 128),
                 pk.wgmma_desc(sb, 16 * s, 16, 1024, 128), "f16", s > 0)
        pk.wgmma_commit_group()
        pk.wgmma_wait_group(0, acc)
    w, g, q = t // 32, (t % 32) // 4, t % 4
    for i in pk.static_range(N // 2):
        c[(16 * w + g + 8 * ((i // 2) % 2)) * N + 8 * (i // 4) + 2 * q + i % 2] = acc[i]


@pytest.mark.parametrize("n", [24, 72, 128])
def test_swizzled_tma_feeds_wgmma(device, rng, seed, n):
    """A has 45 rows: the box's last 19 rows are TMA's zero fill. Halves and small integers
    keep every f32 sum exact, so the product is compared bit for bit."""
    a = (rng.integers(-6, 7, (45, 64)) / 2).astype(np.float16)
    b = (rng.integers(-6, 7, (n, 64)) / 2).astype(np.float16)
    c = pk.full(64 * n, np.nan, np.float32)
    ta = pk.tensor_map(pk.to_device(a), (64, 64), swizzle=128)
    tb = pk.tensor_map(pk.to_device(b), (n, 64), swizzle=128)
    tma_wgmma[1, 128](ta, tb, c, n)
    want = np.zeros((64, n), np.float32)
    want[:45] = a.astype(np.float32) @ b.astype(np.float32).T
    assert np.array_equal(c.numpy().reshape(64, n), want), f"N = {n} (seed {seed})"


def _example():
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).parents[2] / "examples" / "tma_wgmma_gemm.py"
    spec = importlib.util.spec_from_file_location("tma_wgmma_gemm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_tma_wgmma_gemm(device, rng, seed):
    """examples/tma_wgmma_gemm.py: its 2-stage pipeline over K slices (the last one partly
    past K) checks its own product, exactly; its PTX assembles for sm_90a."""
    _example().main(8 * int(rng.integers(1, 60)))


def test_example_ptx_assembles(assemble):
    ptx = _example().gemm.ptx("sm_90a", N_=48)
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor.2d.global.shared::cta" in ptx
    assemble(ptx, "sm_90a")
