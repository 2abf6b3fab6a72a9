"""Memory-ordered accesses (pk.load_acquire / load_relaxed / store_release / store_relaxed,
pk.fence, the atomics' order= / scope=): a producer/consumer chain of blocks that wait on each
other's flags (on the CPU target the waiting blocks are scheduled before the ones they wait
for, so only pk.nanosleep's yield lets them finish), a spin that can never end reported as
such, the PTX each maps to (assembled by ptxas per arch), and their errors."""
import numpy as np
import pytest

import pykernel as pk
from pykernel import Ptr, f32, f64, i32, i64, u32, u64


@pk.kernel
def chain(x: Ptr[i32, "ro"], rows: Ptr[i32], flags: Ptr[u32], n: i32):
    """Block b waits for block b + 1's row (its flag), then rows[b] = 3 * rows[b + 1] + x[b]
    and publishes its own flag; the last block starts the chain. Thread 0 waits (acquire)
    and the block meets it at a barrier; thread 0 publishes (release) after a barrier."""
    b = pk.block_idx.x
    last = pk.grid_dim.x - 1
    if pk.thread_idx.x == 0 and b < last:
        while pk.load_acquire(flags, b + 1) == u32(0):
            pk.nanosleep(64)
    pk.syncthreads()
    j = pk.thread_idx.x
    while j < n:
        prev = 0
        if b < last:
            prev = rows[(b + 1) * n + j]
        rows[b * n + j] = 3 * prev + x[b * n + j]
        j += pk.block_dim.x
    pk.syncthreads()
    if pk.thread_idx.x == 0:
        pk.store_release(flags, b, u32(1))


def _chain_reference(x):
    rows = np.zeros_like(x)
    prev = np.zeros(x.shape[1], np.int32)
    for b in range(x.shape[0] - 1, -1, -1):
        with np.errstate(over="ignore"):
            prev = (np.int32(3) * prev + x[b]).astype(np.int32)
        rows[b] = prev
    return rows


@pytest.mark.parametrize("blocks,threads,n", [(7, 45, 101), (3, 64, 64), (1, 32, 5)])
def test_blocks_wait_on_each_others_flags(device, rng, blocks, threads, n):
    x = rng.integers(-1000, 1000, (blocks, n)).astype(np.int32)
    rows = pk.full((blocks, n), -7, np.int32, device)       # poisoned: unwritten rows fail
    flags = pk.zeros(blocks, np.uint32, device)
    chain[blocks, threads](pk.to_device(x, device=device), rows, flags, n)
    np.testing.assert_array_equal(rows.numpy(), _chain_reference(x))
    assert flags.numpy().tolist() == [1] * blocks


@pk.kernel
def every_thread_waits(flags: Ptr[u32], out: Ptr[i32]):
    """Every thread of block 0 spins on block 1's flag (relaxed polls, then an acquire
    fence); block 1's threads write out, then each releases one flag count."""
    t = pk.thread_idx.x
    if pk.block_idx.x == 1:
        out[64 + t] = t * 2
        pk.atomic_add(flags, 0, u32(1), order="release")
    else:
        while pk.load_relaxed(flags, 0) < u32(pk.block_dim.x):
            pk.nanosleep(32)
        pk.fence(order="acq_rel")
        out[t] = out[64 + (pk.block_dim.x - 1 - t)] + 1


def test_every_thread_spins_then_fences():
    prev = pk.current_device()
    dev = pk.set_device("cpu")
    try:
        out = pk.full(128, -1, np.int32, dev)
        flags = pk.zeros(1, np.uint32, dev)
        every_thread_waits[2, 40](flags, out)
        got = out.numpy()
        np.testing.assert_array_equal(got[64:104], np.arange(40) * 2)
        np.testing.assert_array_equal(got[:40], (39 - np.arange(40)) * 2 + 1)
    finally:
        pk.set_device(prev)


@pk.kernel
def waits_for_nobody(flags: Ptr[u32]):
    while pk.load_acquire(flags, 0) == u32(0):
        pk.nanosleep(100)


def test_spin_that_never_ends_is_reported():
    prev = pk.current_device()
    dev = pk.set_device("cpu")
    try:
        flags = pk.zeros(1, np.uint32, dev)
        with pytest.raises(pk.KernelRuntimeError, match=r"spin wait that never ends"
                           r"(.|\n)*test_memorder.py:\d+"):
            waits_for_nobody[2, 8](flags)
    finally:
        pk.set_device(prev)


@pk.kernel
def ordered_ops(a: Ptr[u32], c: Ptr[i64], d: Ptr[f64], f: Ptr[f32], out: Ptr[u64]):
    """One thread: each ordered form's result, to compare with plain Python arithmetic."""
    out[0] = u64(pk.atomic_add(a, 0, u32(5), order="acq_rel"))
    out[1] = u64(pk.atomic_cas(a, 1, u32(9), u32(4), order="acquire", scope="cta"))
    out[2] = u64(pk.atomic_exch(a, 2, u32(11), order="release", scope="sys"))
    out[3] = u64(pk.atomic_max(a, 3, u32(6), order="relaxed"))
    pk.store_release(c, 0, i64(-(1 << 40)))
    out[4] = u64(pk.load_acquire(c, 0) + i64(1))
    pk.store_relaxed(d, 0, pk.load_relaxed(d, 1) * 2.0, scope="sys")
    old = pk.atomic_add(f, 0, f32(1.5), order="acq_rel", scope="gpu")
    out[5] = u64(old * 2.0)
    pk.fence(scope="sys", order="sc")


def test_ordered_forms_compute_what_plain_ones_do(device):
    a = pk.to_device(np.array([7, 9, 3, 2], np.uint32), device=device)
    c = pk.zeros(1, np.int64, device)
    d = pk.to_device(np.array([0.0, 2.25]), device=device)
    f = pk.to_device(np.array([4.0], np.float32), device=device)
    out = pk.full(6, 99, np.uint64, device)
    ordered_ops[1, 1](a, c, d, f, out)
    assert out.numpy().tolist() == [7, 9, 3, 2, (1 << 64) - (1 << 40) + 1, 8]
    assert a.numpy().tolist() == [12, 4, 11, 6]
    assert c.numpy().tolist() == [-(1 << 40)] and d.numpy().tolist() == [4.5, 2.25]
    assert f.numpy().tolist() == [5.5]


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
def test_memorder_ptx(arch, checked_ptx):
    checked_ptx(ordered_ops, arch, "atom.acq_rel.gpu.add.u32", "atom.acquire.cta.cas.b32",
                "atom.release.sys.exch.b32", "atom.relaxed.gpu.max.u32", "st.release.gpu.b64",
                "ld.acquire.gpu.b64", "ld.relaxed.gpu.b64", "st.relaxed.sys.b64",
                "atom.acq_rel.gpu.add.f32", "fence.sc.sys")
    checked_ptx(chain, arch, "ld.acquire.gpu.b32", "st.release.gpu.b32", "nanosleep.u32")
    checked_ptx(every_thread_waits, arch, "atom.release.gpu.add.u32", "fence.acq_rel.gpu")


@pk.kernel
def cluster_scoped(flags: Ptr[u32]):
    pk.store_release(flags, 0, u32(1), scope="cluster")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cluster_scope_needs_sm90(arch, checked_ptx):
    if arch == "sm_80":
        with pytest.raises(pk.UnsupportedArchError, match=r"pk.store_release \(scope "
                           r"'cluster'\) needs sm_90 or newer; compiling for sm_80"):
            cluster_scoped.ptx(arch)
        return
    checked_ptx(cluster_scoped, arch, "st.release.cluster.b32")


def _compile_error(body_src: str, tmp_path) -> str:
    namespace = {"pk": pk, "Ptr": Ptr, "u32": u32, "f32": f32, "i32": i32, "u64": u64}
    src = "def k(p: Ptr[u32], q: Ptr[f32], r: Ptr[u64, 'ro']):\n    " + body_src + "\n"
    path = str(tmp_path / "memorder_error.py")     # a file, so errors can quote the line
    with open(path, "w") as fh:
        fh.write(src)
    exec(compile(src, path, "exec"), namespace)
    with pytest.raises(pk.KernelSourceError) as err:
        pk.kernel(namespace["k"]).ptx("sm_90")
    return str(err.value)


@pytest.mark.parametrize("body,message", [
    ("pk.load_acquire(p, 0, scope='device')",
     "scope must be a constant string, one of 'cta', 'cluster', 'gpu', 'sys'"),
    ("pk.atomic_add(p, 0, u32(1), order='sc')",
     "order must be a constant string, one of 'relaxed', 'acquire', 'release', 'acq_rel'"),
    ("pk.fence(order='acquire')", "order must be a constant string, one of 'acq_rel', 'sc'"),
    ("pk.fence('gpu')", "pk.fence takes keywords only"),
    ("pk.store_release(r, 0, u64(1))", "cannot store through a read-only pointer"),
    ("pk.atomic_max(q, 0, f32(1), order='acq_rel')", "with order/scope takes integers"),
    ("pk.load_acquire(p, 0, order='acquire')", "has no keyword 'order'"),
    ("pk.atomic_add(p, 0, u32(1), sem='acq_rel')", "has no keyword 'sem'"),
])
def test_memorder_errors(body, message, tmp_path):
    assert message in _compile_error(body, tmp_path)
