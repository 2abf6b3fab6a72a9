"""The NCCL layer alone, on 2 GPUs (gpu mark): two processes meet through the rendezvous
(llm.parallel.launch), sum pykernel arrays with NcclCommunicator eagerly and inside a captured
graph (on the stream the launches go to), and gather host arrays. A failure here is the
plumbing (nccl4py, devices, streams), not the sharding, which the CPU tests check."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
WORLD = 2


def rank_main() -> None:
    """One rank (run in its own process with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*)."""
    from llm.parallel.launch import RankEnv, join_rendezvous, serve_rendezvous, visible_device
    env = RankEnv.from_environ()
    os.environ["CUDA_VISIBLE_DEVICES"] = visible_device(env.local_rank, os.environ)
    import pykernel as pk
    from llm.parallel.nccl_comm import NcclCommunicator, new_unique_id
    device = pk.set_device("cuda")
    if env.rank == 0:
        unique_id = new_unique_id()
        serve_rendezvous(env, unique_id)
    else:
        _, unique_id = join_rendezvous(env)
    comm = NcclCommunicator(env.rank, env.world_size, unique_id, device)
    n = env.world_size
    x = pk.to_device(np.full((3, 5), env.rank + 1, np.float32))
    comm.all_reduce_sum(x, stream=device.launch_stream_handle)
    pk.synchronize(device)
    assert (x.numpy() == n * (n + 1) / 2).all(), x.numpy()
    parts = comm.all_gather_host(np.arange(4, dtype=np.int32) + 10 * env.rank)
    assert [p.tolist() for p in parts] == [[10 * r + i for i in range(4)] for r in range(n)]
    y = pk.to_device(np.ones(7, np.float32))
    with pk.capture_graph(pk.Stream(device)) as graph:     # the sum captured, not run
        comm.all_reduce_sum(y, stream=device.launch_stream_handle)
    pk.synchronize(device)
    assert (y.numpy() == 1).all(), "the all-reduce ran during capture"
    graph.replay()
    graph.replay()
    pk.synchronize(device)
    assert (y.numpy() == n * n).all(), y.numpy()
    comm.close()
    print(f"RANK_OK {env.rank}", flush=True)


@pytest.mark.gpu
def test_nccl_sums_eagerly_and_in_graphs_between_two_processes():
    from cuda.bindings import driver
    driver.cuInit(0)
    err, count = driver.cuDeviceGetCount()
    if err or count < WORLD:
        pytest.skip(f"needs {WORLD} GPUs (this machine has {count})")
    pytest.importorskip("nccl.core", reason="nccl4py is not installed")
    from llm.parallel.launch import free_port
    port = str(free_port())
    procs = [subprocess.Popen(
        [sys.executable, "-c", "from tests.llm.test_tp_nccl import rank_main; rank_main()"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
                 [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                if p]),
             "RANK": str(r), "WORLD_SIZE": str(WORLD),
             "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(WORLD)]
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:     # one hung in NCCL: do not leave it behind
                p.kill()
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"RANK_OK {r}" in out, f"rank {r}:\n{out[-3000:]}"
