"""Thread-block clusters: cluster launches, pk.cluster_rank / cluster_size / cluster_sync and
distributed shared memory through pk.cluster_map, on the CPU target and the GPU (sm_90+),
plus their launch and compile errors."""

import numpy as np
import pytest

import pykernel as pk
from pykernel import (KernelRuntimeError, KernelSourceError, LaunchError, Ptr, f32, i32)
from pykernel.errors import UnsupportedArchError


@pk.kernel
def cluster_sums(x: Ptr[f32, "ro"], total: Ptr[f32], right: Ptr[f32], ranks: Ptr[i32]):
    """Block b sums its part of x into shared memory; after a cluster_sync rank 0 adds every
    block's sum (total[b]) and each block reads its right neighbour's (right[b])."""
    part = pk.shared_array(f32, 32)
    tid = pk.thread_idx.x
    b = pk.block_idx.x + pk.grid_dim.x * (pk.block_idx.y + pk.grid_dim.y * pk.block_idx.z)
    v = x[b * pk.block_dim.x + tid]
    for s in pk.static_range(5):
        v += pk.shfl_xor(v, 16 >> s)
    if tid % 32 == 0:
        part[1 + tid // 32] = v
    pk.syncthreads()
    rank = pk.cluster_rank()
    size = pk.cluster_size()
    if tid == 0:
        t = f32(0.0)
        for w in range(pk.block_dim.x // 32):
            t += part[1 + w]
        part[0] = t
        ranks[b] = rank + 100 * size
    pk.cluster_sync()
    if tid == 0:
        right[b] = pk.cluster_map(part, (rank + 1) % size)[0]
        total[b] = -1.0
        if rank == 0:
            t = f32(0.0)
            for r in range(size):
                t += pk.cluster_map(part, r)[0]
            total[b] = t
    pk.cluster_sync()        # no block exits while another may still read its memory


def reference(x, grid, block, cluster):
    """(total, right, ranks) per linear block index."""
    gx, gy, gz = grid
    cx, cy, cz = cluster
    sums = x.reshape(-1, block).astype(np.float64).sum(1)
    n = gx * gy * gz
    total, right, ranks = np.full(n, -1.0), np.zeros(n), np.zeros(n, np.int64)
    size = cx * cy * cz

    def lin(bx, by, bz):
        return bx + gx * (by + gy * bz)

    for bz in range(gz):
        for by in range(gy):
            for bx in range(gx):
                ox, oy, oz = bx - bx % cx, by - by % cy, bz - bz % cz
                members = [lin(ox + r % cx, oy + r // cx % cy, oz + r // (cx * cy))
                           for r in range(size)]
                rank = bx % cx + cx * (by % cy + cy * (bz % cz))
                b = lin(bx, by, bz)
                ranks[b] = rank + 100 * size
                right[b] = sums[members[(rank + 1) % size]]
                if rank == 0:
                    total[b] = sums[members].sum()
    return total, right, ranks


@pytest.mark.parametrize("grid,block,cluster", [
    ((4, 2, 1), 64, (2, 1, 1)),
    ((4, 2, 2), 96, (2, 2, 1)),
    ((8, 1, 1), 32, (8, 1, 1)),
    ((2, 3, 2), 64, (1, 3, 2)),
    ((3, 1, 1), 64, None),          # no cluster launch: every block is its own cluster
])
def test_cluster_sums(device, rng, grid, block, cluster):
    n = grid[0] * grid[1] * grid[2]
    x = rng.standard_normal(n * block).astype(np.float32)
    xd = pk.to_device(x, device=device)
    total, right = pk.full((n,), np.nan, np.float32, device), pk.full((n,), np.nan, np.float32,
                                                                       device)
    ranks = pk.full((n,), -7, np.int32, device)
    cluster_sums[grid, block, None, 0, cluster](xd, total, right, ranks)
    want_total, want_right, want_ranks = reference(x, grid, block, cluster or (1, 1, 1))
    np.testing.assert_array_equal(ranks.numpy(), want_ranks)
    np.testing.assert_allclose(right.numpy(), want_right, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(total.numpy(), want_total, rtol=1e-5, atol=1e-5)


@pk.kernel
def ring_rounds(out: Ptr[i32], rounds: i32):
    """Each round every block passes its value to the next rank through distributed shared
    memory: after `rounds` rounds block r holds the start value of rank r - rounds."""
    cell = pk.shared_array(i32, 2)
    rank = pk.cluster_rank()
    size = pk.cluster_size()
    if pk.thread_idx.x == 0:
        cell[0] = 1000 * pk.block_idx.x + 7
    for k in range(rounds):
        pk.cluster_sync()                                  # cell[k % 2] written everywhere
        if pk.thread_idx.x == 0:
            nxt = pk.cluster_map(cell, (rank + 1) % size)
            nxt[(k + 1) % 2] = cell[k % 2]                 # remote store
    pk.cluster_sync()
    if pk.thread_idx.x == 0:
        out[pk.block_idx.x] = cell[rounds % 2]


def test_cluster_sync_in_a_loop_with_remote_stores(device):
    blocks, size, rounds = 8, 4, 5
    out = pk.full((blocks,), -1, np.int32, device)
    ring_rounds[blocks, 64, None, 0, size](out, rounds)
    start = 1000 * np.arange(blocks) + 7
    base = np.arange(blocks) - np.arange(blocks) % size
    want = start[base + (np.arange(blocks) - rounds) % size]
    np.testing.assert_array_equal(out.numpy(), want)


def test_cluster_launch_in_a_graph(device):
    out = pk.full((4,), -1, np.int32, device)
    with pk.capture_graph() as g:                  # recorded, not run
        ring_rounds[4, 32, None, 0, 2](out, 1)
    g.replay()
    pk.synchronize(device)
    want = (1000 * np.arange(4) + 7)[[1, 0, 3, 2]]
    np.testing.assert_array_equal(out.numpy(), want)


def test_launch_errors():
    with pytest.raises(LaunchError, match="not a whole number of clusters"):
        ring_rounds[6, 32, None, 0, 4]
    with pytest.raises(LaunchError, match="at most 16 blocks per cluster"):
        ring_rounds[32, 32, None, 0, 32]
    with pytest.raises(LaunchError, match="cluster must be a positive int"):
        ring_rounds[4, 32, None, 0, (0, 1)]


@pk.kernel
def bad_rank(out: Ptr[i32], rank: i32):
    cell = pk.shared_array(i32, 1)
    cell[0] = 5
    pk.cluster_sync()
    out[pk.block_idx.x] = pk.cluster_map(cell, rank)[0]
    pk.cluster_sync()


@pk.kernel
def divergent_sync(out: Ptr[i32]):
    if pk.block_idx.x == 0:
        pk.cluster_sync()
    else:
        pk.syncthreads()
    out[pk.block_idx.x] = 1


@pk.kernel
def split_sync(out: Ptr[i32]):
    if pk.thread_idx.x < 16:
        pk.cluster_sync()
    else:
        pk.syncthreads()
    out[pk.block_idx.x] = 1


@pk.kernel
def warp_split_sync(out: Ptr[i32]):
    v = pk.thread_idx.x
    if pk.thread_idx.x == 0:
        pk.cluster_sync()
    else:
        v = pk.shfl_xor(v, 1)
    out[pk.block_idx.x] = v


def test_cpu_reports_cluster_misuse():
    pk.set_device("cpu")
    out = pk.zeros(4, np.int32)
    bad_rank[4, 32, None, 0, 2](out, 1)
    np.testing.assert_array_equal(out.numpy(), 5)
    with pytest.raises(KernelRuntimeError, match="cluster_map\\(\\) rank outside the cluster"):
        bad_rank[4, 32, None, 0, 2](out, 2)
    with pytest.raises(KernelRuntimeError, match="divergent"):
        divergent_sync[4, 32, None, 0, 2](out)
    with pytest.raises(KernelRuntimeError, match="syncthreads\\(\\) reached in divergent"):
        split_sync[2, 32, None, 0, 2](out)
    # lane 0 at the cluster barrier, the rest of its warp at a shuffle
    with pytest.raises(KernelRuntimeError, match="warp operation reached in divergent"):
        warp_split_sync[2, 32, None, 0, 2](out)


def test_cluster_map_needs_shared_memory():
    @pk.kernel
    def mapped_global(x: Ptr[f32]):
        y = pk.cluster_map(x, 0)
        y[0] = 1.0
    with pytest.raises(KernelSourceError, match="cluster_map maps shared memory") as info:
        mapped_global.ptx("sm_90")
    assert "^" in str(info.value)


def test_clusters_need_sm_90():
    with pytest.raises(UnsupportedArchError, match="needs sm_90 or newer"):
        cluster_sums.ptx("sm_80")


@pytest.mark.parametrize("arch", ["sm_90", "sm_100", "sm_120"])
def test_cluster_ptx_assembles(arch, assemble):
    for k in (cluster_sums, ring_rounds):
        ptx = k.ptx(arch)
        assert "barrier.cluster.arrive.release.aligned" in ptx and "mapa.u64" in ptx
        assemble(ptx, arch)
