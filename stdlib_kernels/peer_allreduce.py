"""One-shot all-reduce (sum, f32) between ranks that can load each other's memory: each rank's
GPU reads its peers' buffers directly (NVLink peer loads of CUDA IPC mappings), no NCCL.

Input, per rank: x (n f32, this rank's partial, summed in place), the W ranks' registered
buffers as pointers this rank can read (its own among them), each `2 * cap` f32 (two slots),
the W ranks' flag arrays (`blocks * W` u32 each), this rank's own per-block epoch counters
(`blocks` u32, zero at the start, bumped by the kernel itself). Output: x = sum over ranks
0, 1, ..., W-1 in that order, so every rank holds bit-identical values.

The protocol, per block b of the fixed grid of `blocks` blocks (every rank launches the same
grid, and every rank makes the same sequence of calls, as with NCCL):

    e    = epochs[b] + 1;  slot = e & 1           # this call's epoch (the kernel counts)
    own[slot][chunk b] = x[chunk b]               # all threads
    bar.sync
    thread 0: for every rank p: st.release.sys flags_p[b * W + rank] = e     # "arrived"
    thread 0: for every rank p: spin until ld.acquire.sys flags_own[b * W + p] >= e
    bar.sync
    x[chunk b] = bufs_0[slot][chunk b] + ... + bufs_{W-1}[slot][chunk b]    # rank order
    thread 0: epochs[b] = e

Memory order. The release store is cumulative (st.release = fence.acq_rel + relaxed store):
the block's copies, ordered before thread 0 by bar.sync, are visible at system scope to any
thread that acquires the flag value, and the peer's thread 0 acquires it and hands it to its
block through bar.sync, so its loads of our slot see the copies. System scope because the flag
and the data cross GPUs (scope "gpu" only orders accesses within one GPU). Flags are pushed to
the reader's own memory, so the spin polls local memory; data is pulled over NVLink.

Reuse without a second barrier: two slots. In call e a rank writes its slot e & 1, which its
peers last read in call e - 2. It writes only after passing call e - 1's wait, which needs
every peer's call e - 1 arrival; a peer arrives after its call e - 2 finished (stream order:
call e - 1 starts after call e - 2's blocks are done, and its release orders everything
before it), so no peer still reads the slot. A peer that is one call ahead stores e + 1 into
our flag while we may still wait for e, so the wait is `flag >= e` (as a wrapping difference),
never `flag == e`. Counting epochs per block keeps them race-free (thread 0 of block b is the
only reader and writer of epochs[b]; launches are ordered) and the same on every rank.

Blocks of one rank never wait on each other, only on the same block index of the other ranks;
with at most as many blocks as stay resident (a few dozen), every rank's block b runs and no
cycle of waits can form. The n of a call may change (a decode row, a prompt's rows) as long as
n <= cap; the chunk of block b is ceil(n / blocks) elements.

On the CPU target a kernel that calls pk.nanosleep runs its grid as one cluster of coroutines:
`allreduce_ranks` runs W ranks' blocks in one launch (rank = block_idx.y), interleaved at every
spin, which is how the protocol is tested without GPUs (separate launches from several threads
do run concurrently on the CPU device, but a spin wait on another launch may be reported as a
deadlock there: docs/runtime.md, "The CPU device").
"""
import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32

MAX_WORLD = 8          # pointer parameters d0..d7 / f0..f7; unused ones repeat a real one


@pk.func
def load_from(k: Const[int], i, d0, d1, d2, d3, d4, d5, d6, d7):
    """d_k[i] for a compile-time k (the pointer tables are parameters, not memory)."""
    return pick(k, d0, d1, d2, d3, d4, d5, d6, d7)[i]


@pk.func
def release_to(k: Const[int], i, v, f0, f1, f2, f3, f4, f5, f6, f7):
    """st.release.sys f_k[i] = v for a compile-time k."""
    pk.store_release(pick(k, f0, f1, f2, f3, f4, f5, f6, f7), i, v, scope="sys")


@pk.func
def oneshot_block(x, x_at: i32, own, d0, d1, d2, d3, d4, d5, d6, d7,
                  own_flags, f0, f1, f2, f3, f4, f5, f6, f7, epochs, epoch_at: i32,
                  n: i32, cap: i32, rank: i32, block: i32, blocks: i32,
                  W: Const[int], BLOCK: Const[int]):
    """One block's part of one rank's call (the protocol in the module docstring). own /
    own_flags are this rank's d_rank / f_rank; x and epochs are read from x_at / epoch_at on
    (the CPU test packs W ranks into one array)."""
    t = pk.thread_idx.x
    e = epochs[epoch_at + block] + u32(1)
    slot_at = i32(e & u32(1)) * cap
    chunk = (n + blocks - 1) // blocks
    lo = block * chunk
    hi = min(lo + chunk, n)
    j = lo + t
    while j < hi:                           # this rank's partial into its own slot
        own[slot_at + j] = x[x_at + j]
        j += BLOCK
    pk.syncthreads()                        # every copy before thread 0's release
    if t == 0:
        for k in pk.static_range(W):        # arrived: e into every rank's flag for us
            release_to(k, block * W + rank, e, f0, f1, f2, f3, f4, f5, f6, f7)
        for k in pk.static_range(W):        # until every rank arrived (or is further on)
            while i32(pk.load_acquire(own_flags, block * W + k, scope="sys") - e) < 0:
                pk.nanosleep(32)
        epochs[epoch_at + block] = e        # only this thread reads it, next launch
    pk.syncthreads()                        # thread 0's acquires order the block's loads
    j = lo + t
    while j < hi:
        total = load_from(0, slot_at + j, d0, d1, d2, d3, d4, d5, d6, d7)
        for k in pk.static_range(1, W):     # rank order on every rank: identical sums
            total = total + load_from(k, slot_at + j, d0, d1, d2, d3, d4, d5, d6, d7)
        x[x_at + j] = total
        j += BLOCK


@pk.kernel
def allreduce_oneshot(x: Ptr[f32], own: Ptr[f32], d0: Ptr[f32], d1: Ptr[f32], d2: Ptr[f32],
                      d3: Ptr[f32], d4: Ptr[f32], d5: Ptr[f32], d6: Ptr[f32], d7: Ptr[f32],
                      own_flags: Ptr[u32], f0: Ptr[u32], f1: Ptr[u32], f2: Ptr[u32],
                      f3: Ptr[u32], f4: Ptr[u32], f5: Ptr[u32], f6: Ptr[u32], f7: Ptr[u32],
                      epochs: Ptr[u32], n: i32, cap: i32, rank: i32,
                      W: Const[int], BLOCK: Const[int]):
    """x (n f32) summed over W ranks in place; grid (blocks, 1), block BLOCK threads, the
    same on every rank and every call. d_k / f_k: rank k's data (2 * cap f32) and flags
    (blocks * W u32) as this rank addresses them, own / own_flags: d_rank / f_rank again;
    epochs: this rank's (blocks u32)."""
    oneshot_block(x, 0, own, d0, d1, d2, d3, d4, d5, d6, d7, own_flags,
                  f0, f1, f2, f3, f4, f5, f6, f7, epochs, 0, n, cap, rank,
                  pk.block_idx.x, pk.grid_dim.x, W, BLOCK)


@pk.func
def pick(k: i32, p0, p1, p2, p3, p4, p5, p6, p7):
    """p_k for a run-time k in [0, MAX_WORLD): the result keeps the bounds of the array it
    points into, so the CPU target checks the chosen rank's buffer."""
    low = (p0 if k == 0 else p1) if k < 2 else (p2 if k == 2 else p3)
    high = (p4 if k == 4 else p5) if k < 6 else (p6 if k == 6 else p7)
    return low if k < 4 else high


@pk.kernel
def allreduce_ranks(xs: Ptr[f32], d0: Ptr[f32], d1: Ptr[f32], d2: Ptr[f32], d3: Ptr[f32],
                    d4: Ptr[f32], d5: Ptr[f32], d6: Ptr[f32], d7: Ptr[f32],
                    f0: Ptr[u32], f1: Ptr[u32], f2: Ptr[u32], f3: Ptr[u32], f4: Ptr[u32],
                    f5: Ptr[u32], f6: Ptr[u32], f7: Ptr[u32], epochs: Ptr[u32],
                    n: i32, cap: i32, W: Const[int], BLOCK: Const[int]):
    """W ranks' calls of allreduce_oneshot in one launch, for the CPU target: grid
    (blocks, W), rank = block_idx.y, xs (W, n) the ranks' x rows, epochs (W, blocks). The
    blocks interleave at every spin (pk.nanosleep yields), so each rank's wait really waits
    on the others' arrivals."""
    rank = pk.block_idx.y
    blocks = pk.grid_dim.x
    own = pick(rank, d0, d1, d2, d3, d4, d5, d6, d7)          # this rank's own buffer, flags
    own_flags = pick(rank, f0, f1, f2, f3, f4, f5, f6, f7)
    oneshot_block(xs, rank * n, own, d0, d1, d2, d3, d4, d5, d6, d7, own_flags,
                  f0, f1, f2, f3, f4, f5, f6, f7, epochs, rank * blocks, n, cap, rank,
                  pk.block_idx.x, blocks, W, BLOCK)
