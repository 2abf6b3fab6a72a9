"""The NCCL layer alone, on 2 GPUs (gpu mark): two processes meet through the rendezvous
(llm.parallel.launch), sum pykernel arrays with NcclCommunicator eagerly and inside a captured
graph (on the stream the launches go to), and gather host arrays. A failure here is the
plumbing (nccl4py, devices, streams), not the sharding, which the CPU tests check.

The graph is destroyed before the communicator: from NCCL 2.26 ncclCommDestroy waits until every
graph that captured the communicator's collectives is gone, so closing it with the graph alive
hangs for ever (this test's first GPU run did, with no output). Each rank prints the step it is
entering and a watchdog (faulthandler) dumps its stack and ends it when one step takes longer
than STEP_TIMEOUT_S; the test ends the other rank as soon as one fails."""
import faulthandler
import gc
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tests.child_env import child_env

REPO = Path(__file__).resolve().parents[2]
WORLD = 2
STEP_TIMEOUT_S = 60      # one step of a rank (imports and CUDA start-up included)
TEST_TIMEOUT_S = 180     # both ranks, start to finish
RANK_CODE = "from tests.llm.test_tp_nccl import rank_main; rank_main()"


def rank_main() -> None:
    """One rank (run in its own process with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*)."""
    from llm.parallel.launch import RankEnv, join_rendezvous, serve_rendezvous, visible_device
    env = RankEnv.from_environ()

    def step(name: str) -> None:     # say where we are; a step that hangs dumps its stack
        print(f"rank {env.rank}: {name}", flush=True)
        faulthandler.dump_traceback_later(STEP_TIMEOUT_S, exit=True)

    step("CUDA start-up")
    os.environ["CUDA_VISIBLE_DEVICES"] = visible_device(env.local_rank, os.environ)
    import pykernel as pk
    from llm.parallel.nccl_comm import NcclCommunicator, new_unique_id
    device = pk.set_device("cuda")
    step("rendezvous")
    if env.rank == 0:
        unique_id = new_unique_id()
        serve_rendezvous(env, unique_id, timeout=STEP_TIMEOUT_S)
    else:
        _, unique_id = join_rendezvous(env, timeout=STEP_TIMEOUT_S)
    step("NCCL init")
    comm = NcclCommunicator(env.rank, env.world_size, unique_id, device)
    n = env.world_size
    step("eager all-reduce")
    x = pk.to_device(np.full((3, 5), env.rank + 1, np.float32))
    comm.all_reduce_sum(x, stream=device.launch_stream_handle)
    pk.synchronize(device)
    assert (x.numpy() == n * (n + 1) / 2).all(), x.numpy()
    step("all_gather_host")
    parts = comm.all_gather_host(np.arange(4, dtype=np.int32) + 10 * env.rank)
    assert [p.tolist() for p in parts] == [[10 * r + i for i in range(4)] for r in range(n)]
    step("captured all-reduce")
    y = pk.to_device(np.ones(7, np.float32))
    with pk.capture_graph(pk.Stream(device)) as graph:     # the sum captured, not run
        comm.all_reduce_sum(y, stream=device.launch_stream_handle)
    pk.synchronize(device)
    assert (y.numpy() == 1).all(), "the all-reduce ran during capture"
    step("graph replays")
    graph.replay()
    graph.replay()
    pk.synchronize(device)
    assert (y.numpy() == n * n).all(), y.numpy()
    step("graph destroyed, then the communicator")
    del graph            # NCCL frees the communicator only once its graphs are gone
    gc.collect()
    comm.close()
    faulthandler.cancel_dump_traceback_later()
    print(f"RANK_OK {env.rank}", flush=True)


def wait_for_ranks(procs, deadline: float) -> None:
    """Until every rank exited, one failed (the others, waiting for it in NCCL, are ended a
    few seconds later), or the deadline passed (all ended)."""
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return
        if any(c not in (None, 0) for c in codes):
            time.sleep(5)       # let a rank that is failing too print its own error
            break
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.gpu
def test_nccl_sums_eagerly_and_in_graphs_between_two_processes(tmp_path):
    from cuda.bindings import driver
    driver.cuInit(0)
    err, count = driver.cuDeviceGetCount()
    if err or count < WORLD:
        pytest.skip(f"needs {WORLD} GPUs (this machine has {count})")
    pytest.importorskip("nccl.core", reason="nccl4py is not installed")
    from llm.parallel.launch import free_port
    port = str(free_port())
    logs = [tmp_path / f"rank{r}.log" for r in range(WORLD)]    # files: no pipe to fill
    procs = []
    for r in range(WORLD):
        with open(logs[r], "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-c", RANK_CODE],
                env=child_env(RANK=str(r), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(r),
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
    wait_for_ranks(procs, time.monotonic() + TEST_TIMEOUT_S)
    outs = [log.read_text() for log in logs]
    report = "\n".join(f"--- rank {r} (exit {p.returncode}):\n{out[-3000:]}"
                       for r, (p, out) in enumerate(zip(procs, outs)))
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"RANK_OK {r}" in out, report
