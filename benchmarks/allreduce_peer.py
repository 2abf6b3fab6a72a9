"""The one-shot peer all-reduce (llm/parallel/peer_allreduce.py) against NCCL's, per size, on
W GPUs of one host (issue 42).

Input: env WORLD (default 2,4: each cut to the GPUs present), SIZES_KB (default
4,16,64,256,1024), ITERS (eager calls per size, default 200), GRAPH_CALLS (all-reduces per
captured graph, default 32), REPLAYS (default 20), BLOCKS (the one-shot grid, default 16),
PDL (1: graphs captured with PDL, as the runner's decode graphs). Output: a header (GPUs, date,
commit), then per world size one row per size: microseconds per f32 all-reduce, eagerly from
Python and inside a CUDA graph, for NCCL and the one-shot kernel, and whether both gave the
rank-order sum (one-shot: bit for bit on every rank; NCCL: within float32 rounding).

Each rank is a process of its own seeing one GPU (as the runner's), started here with the
NCCL unique id; NCCL_NVLS_ENABLE=0 (nccl_comm.py). No NVLink multicast is made.

    python3 benchmarks/allreduce_peer.py
    WORLD=2 SIZES_KB=16 python3 benchmarks/allreduce_peer.py
"""
import datetime
import multiprocessing as mp
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def env_ints(name: str, default: str) -> list[int]:
    return [int(v) for v in os.environ.get(name, default).split(",") if v.strip()]


def rank_main(rank: int, world: int, unique_id: bytes, sizes_kb, out_queue) -> None:
    from llm.parallel.launch import visible_device
    # before CUDA starts in this process: the rank-th visible GPU, as the runner's workers
    os.environ["CUDA_VISIBLE_DEVICES"] = visible_device(rank, os.environ)
    import pykernel as pk
    from llm.parallel.nccl_comm import NcclCommunicator
    from llm.parallel.peer_allreduce import PeerAllReduce, open_peer_allreduce
    device = pk.set_device("cuda")
    nccl = NcclCommunicator(rank, world, unique_id, device)
    peer = open_peer_allreduce(nccl, device, max(sizes_kb) * 1024,
                               blocks=int(os.environ.get("BLOCKS", "16")))
    rows = []
    for kb in sizes_kb:
        n = kb * 1024 // 4
        row = {"kb": kb, "peer": isinstance(peer, PeerAllReduce)}
        row["check_nccl"], row["check_peer"] = check(nccl, peer, n, rank, world, device)
        for name, comm in (("nccl", nccl), ("peer", peer)):
            row[f"{name}_eager_us"] = eager_us(comm, n, device)
            row[f"{name}_graph_us"] = graph_us(comm, n, device)
        rows.append(row)
    out_queue.put((rank, rows))
    peer.close()


def check(nccl, peer, n, rank, world, device):
    """(NCCL close to the rank-order sum, one-shot equal to it bit for bit on every rank)."""
    import numpy as np

    import pykernel as pk
    parts = [np.random.default_rng(1000 + r).standard_normal(n).astype(np.float32)
             for r in range(world)]
    expected = parts[0].copy()
    for p in parts[1:]:
        expected = expected + p
    results = []
    for comm in (nccl, peer):
        x = pk.to_device(parts[rank], device=device)
        comm.all_reduce_sum(x, stream=device.launch_stream_handle)
        results.append(x.numpy())
    tol = 4 * world * np.finfo(np.float32).eps * np.abs(np.stack(parts)).sum(0)
    nccl_ok = bool((np.abs(results[0] - expected) <= tol).all())
    peer_rows = nccl.all_gather_host(results[1])
    return nccl_ok, all(np.array_equal(r, expected) for r in peer_rows)


def eager_us(comm, n, device, iters=None) -> float:
    import numpy as np

    import pykernel as pk
    iters = iters or int(os.environ.get("ITERS", "200"))
    x = pk.zeros(n, np.float32, device)
    for _ in range(10):
        comm.all_reduce_sum(x, stream=device.launch_stream_handle)
    barrier(comm, device)
    start = time.perf_counter()
    for _ in range(iters):
        comm.all_reduce_sum(x, stream=device.launch_stream_handle)
    pk.synchronize(device)
    return (time.perf_counter() - start) / iters * 1e6


def graph_us(comm, n, device) -> float:
    import numpy as np

    import pykernel as pk
    from benchmarks._timing import captured, seconds_per_replay
    calls = int(os.environ.get("GRAPH_CALLS", "32"))
    replays = int(os.environ.get("REPLAYS", "20"))
    pdl = os.environ.get("PDL", "0") not in ("", "0")
    x = pk.zeros(n, np.float32, device)
    stream = pk.Stream(device)

    def record():
        for _ in range(calls):
            comm.all_reduce_sum(x, stream=device.launch_stream_handle)

    graph = captured(record, stream, pdl)
    barrier(comm, device)              # the ranks start timing together
    return seconds_per_replay(graph, stream, replays) * 1e6 / calls


def barrier(comm, device) -> None:
    import numpy as np

    import pykernel as pk
    pk.synchronize(device)
    comm.all_gather_host(np.zeros(1, np.uint8))


def run_world(world: int, sizes_kb) -> list[dict]:
    from llm.parallel.nccl_comm import new_unique_id
    unique_id = new_unique_id()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, world, unique_id, sizes_kb, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    return results[0]


def gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                         check=False).stdout
    return len([line for line in out.splitlines() if line.startswith("GPU ")])


def main() -> int:
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    sizes_kb = env_ints("SIZES_KB", "4,16,64,256,1024")
    gpus = gpu_count()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    print(f"# allreduce_peer: {gpus} GPU(s), {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"tree {commit}, blocks {os.environ.get('BLOCKS', '16')}, "
          f"PDL {os.environ.get('PDL', '0')}")
    failed = False
    for world in env_ints("WORLD", "2,4"):
        if world > gpus:
            print(f"\nworld {world}: skipped ({gpus} GPU(s))")
            continue
        rows = run_world(world, sizes_kb)
        print(f"\nworld {world} (one-shot {'on' if rows[0]['peer'] else 'UNAVAILABLE: NCCL'})")
        print("| KB | NCCL eager us | one-shot eager us | NCCL graph us | one-shot graph us | "
              "sums ok |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            ok = r["check_nccl"] and r["check_peer"]
            failed |= not ok
            print(f"| {r['kb']} | {r['nccl_eager_us']:.1f} | {r['peer_eager_us']:.1f} | "
                  f"{r['nccl_graph_us']:.2f} | {r['peer_graph_us']:.2f} | "
                  f"{'yes' if ok else 'NO'} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
