"""The floor of a split (flash-decoding) attention at one sequence's 4096 keys (issue 6): a
kernel with the decode's partition and merges but no attention math, in the decode's harness
(CUDA events around CUDA-graph replays, each launch reading its own buffer out of copies worth
>= 256 MB). Whatever a real decode adds (scores, softmax, the m / l rescales) comes on top of
these times, so they bound from below what any split design can reach on the device.

Partition: 8 KV heads x SPLITS blocks, each reading its contiguous share of the 16.8 MB (the
K and V bytes of 32 q / 8 KV heads, D 128, f16, 4096 keys) with UNROLL 16-byte loads in flight
per thread. Stages, each on top of the previous:
  read      every warp reduces what it read and lane 0 stores it (a bare read, this partition)
  + block   every warp holds a 512-float "O" (4 q heads x 128) made from its sum, writes it to
            shared memory (16 KB at 8 warps, like the decode's cross-warp merge; more warps fold
            into 8 first), and the block
            sums the warps' O into its partial (512 floats + m, l) in global memory
  + 1 launch   the last block of each KV head (an atomic ticket after a fence) sums its
               SPLITS partials and stores the head's output: the fused decode's combine
  + 2 launches a second kernel (8 x 4 blocks of 128 threads) sums the partials: the
               split + combine decode's shape
  + cluster    instead, the SPLITS blocks of a KV head form one thread-block cluster and
               rank 0 sums the partials from the others' shared memory (SPLITS <= 16)
Modes: plain graph, and a PDL graph whose kernels trigger at entry and issue every load before
`griddepcontrol.wait` (what early_kv allows for all rows but the newest).

    python3 benchmarks/merge_floor.py [--splits 8,16,32] [--threads 256,512,1024] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from pykernel import Const, Ptr, f32, i32  # noqa: E402
from benchmarks._timing import replay_seconds  # noqa: E402
from stdlib_kernels._select import last_block_done  # noqa: E402

N_KV, GQA, HEAD_DIM = 8, 4, 128
KV_BYTES = 2 * N_KV * 4096 * HEAD_DIM * 2      # K and V, f16: 16.8 MB
O_FLOATS = GQA * HEAD_DIM                      # one KV head's output: 512 floats
STAGES = ("read", "+ block", "+ 1 launch", "+ 2 launches", "+ cluster")


@pk.kernel
def split_floor(x: Ptr[f32, "ro"], part: Ptr[f32], out: Ptr[f32], counters: Ptr[i32],
                chunk_vec: i32, UNROLL: Const[int], MERGE: Const[int], SPLITS: Const[int],
                WARPS: Const[int], PDL: Const[bool]):
    if PDL:
        pk.launch_dependents()
    tid = pk.thread_idx.x
    lane = tid % 32
    warp = tid // 32
    blk = pk.block_idx.x
    vals = pk.local_array(f32, UNROLL * 4)
    acc = f32(0.0)
    base = blk * chunk_vec
    k = tid
    while k < chunk_vec:
        for u in pk.static_range(UNROLL):       # all loads first (clamped, never branched)
            v = base + min(k + u * 32 * WARPS, chunk_vec - 1)
            a, b, c, d = pk.load_vec(x, v * 4, 4)
            vals[u * 4] = a
            vals[u * 4 + 1] = b
            vals[u * 4 + 2] = c
            vals[u * 4 + 3] = d
        for u in pk.static_range(UNROLL):
            if k + u * 32 * WARPS < chunk_vec:
                acc += (vals[u * 4] + vals[u * 4 + 1]) + (vals[u * 4 + 2] + vals[u * 4 + 3])
        k += UNROLL * 32 * WARPS
    for r in pk.static_range(5):
        acc += pk.shfl_xor(acc, 16 >> r)
    if PDL:
        pk.grid_dependency_wait()
    if MERGE == 0:
        if lane == 0:
            out[blk * WARPS + warp] = acc
    else:
        # each warp's "O": 16 floats per lane, through shared memory, summed over the warps
        # (more than 8 warps first fold their sums into 8, as the decode has at most 8 warps)
        OW = min(WARPS, 8)
        if WARPS > 8:
            sums = pk.shared_array(f32, (WARPS,))
            if lane == 0:
                sums[warp] = acc
            pk.syncthreads()
            acc = 0.0
            for w in pk.static_range(WARPS // 8):
                acc += sums[warp % 8 + 8 * w]
        o = pk.shared_array(f32, (OW * O_FLOATS,))
        if warp < OW:
            for j in pk.static_range(O_FLOATS // 32):
                o[warp * O_FLOATS + j * 32 + lane] = acc * f32(j + 1)
        pk.syncthreads()
        mine = pk.shared_array(f32, (O_FLOATS + 2,))      # the block's partial (MERGE 3)
        for e in range(tid, O_FLOATS + 2, 32 * WARPS):    # + m and l
            s = f32(0.0)
            for w in pk.static_range(OW):
                s += o[w * O_FLOATS + min(e, O_FLOATS - 1)]
            if MERGE == 3:
                mine[e] = s
            else:
                part[blk * (O_FLOATS + 2) + e] = s
        if MERGE == 3:     # a cluster per KV head: rank 0 sums the others' partials in place
            pk.cluster_sync()
            if pk.cluster_rank() == 0:
                for e in range(tid, O_FLOATS, 32 * WARPS):
                    s = f32(0.0)
                    for r in range(SPLITS):
                        s += pk.cluster_map(mine, r)[e]
                    out[blk // SPLITS * O_FLOATS + e] = s
            pk.cluster_sync()
        if MERGE == 2:
            head = blk // SPLITS
            done = pk.shared_array(i32, 1)
            if last_block_done(counters, head, SPLITS, done):
                for e in range(tid, O_FLOATS, 32 * WARPS):
                    s = f32(0.0)
                    for sp in range(SPLITS):
                        s += part[(head * SPLITS + sp) * (O_FLOATS + 2) + e]
                    out[head * O_FLOATS + e] = s


@pk.kernel
def combine_floor(part: Ptr[f32, "ro"], out: Ptr[f32], SPLITS: Const[int], PDL: Const[bool]):
    """Block (KV head, q head of its group): 128 threads sum one D-row of the partials."""
    if PDL:
        pk.launch_dependents()
        pk.grid_dependency_wait()
    head = pk.block_idx.x // GQA
    e = pk.block_idx.x % GQA * HEAD_DIM + pk.thread_idx.x
    s = f32(0.0)
    for sp in range(SPLITS):
        s += part[(head * SPLITS + sp) * (O_FLOATS + 2) + e]
    out[head * O_FLOATS + e] = s


def floor_us(bufs, splits: int, threads: int, stage: int, pdl: bool) -> float:
    blocks = N_KV * splits
    chunk_vec = KV_BYTES // 16 // blocks
    unroll = max(1, min(8, chunk_vec // threads))
    warps = threads // 32
    part = pk.zeros((blocks * (O_FLOATS + 2),), np.float32)
    out = pk.zeros((max(blocks * warps, N_KV * O_FLOATS),), np.float32)
    counters = pk.zeros((N_KV,), np.int32)
    merge = (0, 1, 2, 1, 3)[stage]
    cluster = splits if stage == 4 else 1
    launches = max(len(bufs), 20)

    def record():
        for i in range(launches):
            split_floor[blocks, threads, None, 0, cluster](
                bufs[i % len(bufs)], part, out, counters, chunk_vec, unroll, merge, splits,
                warps, pdl)
            if stage == 3:
                combine_floor[N_KV * GQA, HEAD_DIM](part, out, splits, pdl)
    return replay_seconds(record, 5, pdl) * 1e6 / launches


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", default="8,16,32")
    parser.add_argument("--threads", default="256,512,1024")
    parser.add_argument("--out")
    args = parser.parse_args()
    pk.set_device("cuda")
    from benchmarks.attention import copy_bandwidth
    copy_bw = copy_bandwidth()
    target_us = KV_BYTES / (0.7 * copy_bw) * 1e6
    lines = [f"device: {pk.current_device().name}, torch copy {copy_bw / 1e12:.2f} TB/s; "
             f"70% of copy for {KV_BYTES / 1e6:.1f} MB: {target_us:.2f} us", "",
             "| splits x threads | " + " | ".join(f"{s} plain / PDL us" for s in STAGES) + " |",
             "|---" * (len(STAGES) + 1) + "|"]
    print("\n".join(lines), flush=True)
    copies = max(2, -(-(256 << 20) // KV_BYTES))
    bufs = [pk.full((KV_BYTES // 4,), 1.0, np.float32) for _ in range(copies)]
    for splits in (int(s) for s in args.splits.split(",")):
        for threads in (int(t) for t in args.threads.split(",")):
            cells = []
            for st in range(len(STAGES)):
                try:
                    cells.append(f"{floor_us(bufs, splits, threads, st, False):.2f} / "
                                 f"{floor_us(bufs, splits, threads, st, True):.2f}")
                except pk.LaunchError as e:    # e.g. a cluster the GPU cannot place
                    cells.append(f"({str(e).splitlines()[0][:60]})")
            lines.append(f"| {splits} x {threads} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
