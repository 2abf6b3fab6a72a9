"""Warp and block collectives (pk.activemask, match_any, match_all, redux_sync,
syncthreads_count / _and / _or) and timers (clock64, globaltimer, nanosleep) against numpy
models on the CPU target (and the GPU where there is one), with lanes left out by a partial
last warp and by early returns; their PTX, assembled per arch; arch errors."""
import time

import numpy as np
import pytest

import pykernel as pk
from pykernel import Ptr, i32, u32, u64

BLOCK = 45          # the second warp of each block has 13 lanes
FULL = 0xFFFFFFFF
N_BLOCKS = 3


@pk.kernel
def warp_ops(gone: Ptr[i32, "ro"], x: Ptr[u32, "ro"], out: Ptr[u32]):
    """Lanes with gone[i] return first; the rest run the collectives together."""
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if gone[i] != 0:
        return
    pk.syncwarp()                          # the GPU: reconverged after the returns
    v = x[i]
    m = pk.activemask()
    out[8 * i + 0] = m
    out[8 * i + 1] = pk.match_any(m, v & u32(3))
    same, ok = pk.match_all(m, v & u32(1))
    out[8 * i + 2] = same + u32(ok)
    whole, all_ok = pk.match_all(m, i32(7))
    out[8 * i + 3] = whole ^ u32(all_ok)
    out[8 * i + 4] = pk.ballot(True, mask=m) ^ (u32(pk.all_sync(True, mask=m)) << u32(31))


@pk.kernel
def redux_ops(gone: Ptr[i32, "ro"], x: Ptr[u32, "ro"], out: Ptr[u32]):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if gone[i] != 0:
        return
    pk.syncwarp()
    v = x[i]
    s = pk.bitcast(v, i32)
    m = pk.activemask()
    out[8 * i + 0] = pk.redux_sync("add", m, v)
    out[8 * i + 1] = pk.redux_sync("min", m, v)
    out[8 * i + 2] = pk.redux_sync("max", m, v)
    out[8 * i + 3] = pk.bitcast(pk.redux_sync("min", m, s), u32)
    out[8 * i + 4] = pk.bitcast(pk.redux_sync("max", m, s), u32)
    out[8 * i + 5] = pk.redux_sync("and", m, v)
    out[8 * i + 6] = pk.redux_sync("or", m, v)
    out[8 * i + 7] = pk.redux_sync("xor", m, v)


def _warps(gone, n_blocks):
    """Per thread: (mask of its warp's remaining lanes, the lane ids in it)."""
    for blk in range(n_blocks):
        for w0 in range(0, BLOCK, 32):
            lanes = [k for k in range(min(32, BLOCK - w0)) if not gone[blk * BLOCK + w0 + k]]
            yield blk * BLOCK + w0, lanes, sum(1 << k for k in lanes)


def _inputs(rng, n_blocks):
    n = n_blocks * BLOCK
    gone = (rng.random(n) < 0.3).astype(np.int32)
    gone[:32] = 0                             # one whole warp, nobody gone
    x = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    x[32:32 + 13] &= 1                        # a warp of 0/1 values: match_all both ways
    x[45:45 + 32] = x[45]                     # a warp of equal values
    return gone, x


def _run_warps(kernel, rng, device, n_blocks=N_BLOCKS):
    """(gone, x, the 8 output words per thread) of `kernel` run on fresh _inputs."""
    gone, x = _inputs(rng, n_blocks)
    out = pk.full((8 * n_blocks * BLOCK,), 0xDEADBEEF, np.uint32, device)      # poisoned
    kernel[n_blocks, BLOCK](pk.to_device(gone, device=device), pk.to_device(x, device=device),
                            out)
    return gone, x, out.numpy().reshape(-1, 8)


def test_activemask_match_vote(device, rng):
    gone, x, got = _run_warps(warp_ops, rng, device)
    for first, lanes, mask in _warps(gone, N_BLOCKS):
        vals = {k: int(x[first + k]) for k in lanes}
        odd = {v & 1 for v in vals.values()}
        for k in lanes:
            any_mask = sum(1 << j for j in lanes if vals[j] & 3 == vals[k] & 3)
            all_word = mask + 1 if len(odd) == 1 else 0
            want = [mask, any_mask, all_word, mask ^ 1, mask ^ (1 << 31)]
            assert got[first + k, :5].tolist() == want, (first, k)


def test_redux_sync(device, rng):
    gone, x, got = _run_warps(redux_ops, rng, device)
    for first, lanes, _ in _warps(gone, N_BLOCKS):
        if not lanes:
            continue
        v = x[[first + k for k in lanes]]
        s = v.view(np.int32)
        want = [int(v.astype(np.uint64).sum()) & FULL, v.min(), v.max(),
                int(s.min()) & FULL, int(s.max()) & FULL, np.bitwise_and.reduce(v),
                np.bitwise_or.reduce(v), np.bitwise_xor.reduce(v)]
        for k in lanes:
            assert got[first + k].tolist() == [int(w) for w in want], (first, k)


ROUNDS = 5


@pk.kernel
def block_votes(n: i32, x: Ptr[u32, "ro"], out: Ptr[i32]):
    """Five rounds of each barrier reduction on bit r of x (threads past n vote False), a
    shuffle between them (warp exchanges must not disturb the barrier words)."""
    t = pk.thread_idx.x
    i = pk.block_idx.x * pk.block_dim.x + t
    v = x[i] if i < n else u32(0)
    for r in range(ROUNDS):
        p = ((v >> u32(r)) & u32(1)) == u32(1)
        c = pk.syncthreads_count(p)
        v = pk.shfl_xor(v, 1)
        v = pk.shfl_xor(v, 1)
        a = pk.syncthreads_and(p or r == 0)
        o = pk.syncthreads_or(p and t == r)
        if t == 0:
            out[3 * (pk.block_idx.x * ROUNDS + r) + 0] = c
            out[3 * (pk.block_idx.x * ROUNDS + r) + 1] = a
            out[3 * (pk.block_idx.x * ROUNDS + r) + 2] = o


def test_syncthreads_reductions(device, rng):
    n_blocks, block = 3, 80
    n = n_blocks * block - 7                  # the last block has 7 threads past n
    x = np.zeros(n_blocks * block, np.uint32)
    x[:n] = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    x[block:2 * block] |= 0b01000             # block 1: round 3 true everywhere
    out = pk.full((3 * n_blocks * ROUNDS,), -1, np.int32, device)
    block_votes[n_blocks, block](n, pk.to_device(x, device=device), out)
    got = out.numpy().reshape(n_blocks, ROUNDS, 3)
    for b in range(n_blocks):
        for r in range(ROUNDS):
            bits = (x[b * block:(b + 1) * block] >> r) & 1
            want = [int(bits.sum()), int(bool(bits.all()) or r == 0), int(bits[r])]
            assert got[b, r].tolist() == want, (b, r)


@pk.kernel
def timers(out: Ptr[u64]):
    a = pk.clock64()
    pk.nanosleep(1000)
    b = pk.clock64()
    out[0] = u64(b - a)
    out[1] = pk.globaltimer()
    out[2] = u64(b >= a)


def test_timers_on_cpu_target():
    dev = pk.current_device()
    if dev.kind != "cpu":
        pytest.skip("the CPU target's clock_gettime forms")
    out = pk.zeros((3,), np.uint64, dev)
    before = time.time_ns()
    timers[1, 1](out)
    after = time.time_ns()
    elapsed, now, ordered = out.numpy().tolist()
    assert ordered == 1 and elapsed < 10**9
    assert before - 10**6 <= now <= after + 10**6


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
def test_collectives_ptx(arch, checked_ptx):
    checked_ptx(warp_ops, arch, "activemask.b32", "match.any.sync.b32", "match.all.sync.b32")
    checked_ptx(block_votes, arch, "bar.red.popc.u32", "bar.red.and.pred", "bar.red.or.pred")
    checked_ptx(timers, arch, "%clock64", "%globaltimer", "nanosleep.u32")


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
def test_redux_ptx_or_arch_error(arch, checked_ptx):
    if int(arch[3:]) < 80:
        with pytest.raises(pk.UnsupportedArchError, match=r"redux.sync.add \(pk.redux_sync\) "
                           r"needs sm_80 or newer; compiling for sm_75"):
            redux_ops.ptx(arch)
        return
    checked_ptx(redux_ops, arch, "redux.sync.add.s32", "redux.sync.min.u32",
                "redux.sync.max.s32", "redux.sync.and.b32", "redux.sync.or.b32",
                "redux.sync.xor.b32")


def test_collective_argument_errors():
    @pk.kernel
    def bad_op(x: Ptr[u32]):
        x[0] = pk.redux_sync("mul", FULL, x[0])

    @pk.kernel
    def bad_value(x: Ptr[pk.f32]):
        x[0] = pk.f32(pk.redux_sync("add", FULL, x[0]))
    with pytest.raises(pk.KernelSourceError, match="first argument is one of 'add'"):
        bad_op.ptx("sm_90")
    with pytest.raises(pk.KernelSourceError, match="reduces i32 or u32, got"):
        bad_value.ptx("sm_90")
